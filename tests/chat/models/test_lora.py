"""LoRA adapters on the own decoder (chat.models.decoder.lora, lora_files): a turn under an adapter computes what the
model with the adapter merged into its weights computes (float32, 1e-4), alone and in one forward beside other adapters
and the base; PEFT's scaling rules; llama.cpp's GGUF LoRA files; residency; refusals at load."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from chat.engine.runtime import Feed
from chat.models import load_model
from chat.models.decoder.lora import STACKED_ROWS, adapter_identity
from chat.models.errors import AdapterFileError, AdapterMismatchError, UnknownAdapterError
from tests.chat.models.lora_helpers import logits_of, make_peft_adapter, tiny_hf, write_gguf_lora

pytest.importorskip("peft")

IDS = [3, 17, 25, 9, 40, 41, 7, 99, 12, 5, 60, 61, 2, 33]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def runtime():
    return load_model("tiny-llama", weights="float32")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters of tiny-llama made by peft (different seeds, ranks, targets) and their merged models."""
    root = tmp_path_factory.mktemp("adapters")
    one = make_peft_adapter(root / "one", seed=1, r=4, alpha=8)
    two = make_peft_adapter(root / "two", seed=2, r=8, alpha=4, target_modules=["q_proj", "v_proj", "down_proj"])
    return {"one": one, "two": two}


def loaded(runtime, name, path, scale=1.0):
    adapter = runtime.adapters.read(name, str(path), scale)
    runtime.adapters.add(adapter, replace=True)
    return adapter


def forward(runtime, runs_ids):
    feeds = [Feed(run, ids, len(ids)) for run, ids in runs_ids]
    out = runtime.forward_batch(feeds)
    for o in out:
        assert not isinstance(o, Exception), o
    return out


def test_adapter_turn_equals_merged_model(runtime, adapters):
    path, merged = adapters["one"]
    adapter = loaded(runtime, "one", path)
    (got,) = forward(runtime, [(runtime.new_run(adapter=adapter), IDS)])
    diff = (got - logits_of(merged, IDS)).abs().max().item()
    assert diff <= TOLERANCE
    base = logits_of(tiny_hf("llama"), IDS)
    assert (got - base).abs().max().item() > 100 * TOLERANCE  # the adapter changes the logits


def test_adapters_and_base_in_one_forward(runtime, adapters):
    (p1, m1), (p2, m2) = adapters["one"], adapters["two"]
    a1, a2 = loaded(runtime, "one", p1), loaded(runtime, "two", p2)
    calls = []
    original = runtime._model.forward
    runtime._model.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        short = IDS[:9]
        got = forward(
            runtime,
            [
                (runtime.new_run(adapter=a1), IDS),
                (runtime.new_run(), short),
                (runtime.new_run(adapter=a2), IDS),
                (runtime.new_run(adapter=a1), short),
            ],
        )
    finally:
        runtime._model.forward = original
    assert len(calls) == 1  # one forward for every adapter and the base
    base = tiny_hf("llama")
    for out, model, ids in [(got[0], m1, IDS), (got[1], base, short), (got[2], m2, IDS), (got[3], m1, short)]:
        assert (out - logits_of(model, ids)).abs().max().item() <= TOLERANCE


def test_decode_steps_under_adapters_match(runtime, adapters):
    """Prefill, then token by token, three runs in each step: every step equals the merged model's position."""
    (p1, m1), (p2, m2) = adapters["one"], adapters["two"]
    a1, a2 = loaded(runtime, "one", p1), loaded(runtime, "two", p2)
    runs = [runtime.new_run(adapter=a1), runtime.new_run(adapter=a2), runtime.new_run()]
    models = [m1, m2, tiny_hf("llama")]
    forward(runtime, [(r, IDS[:5]) for r in runs])
    for t in range(5, len(IDS)):
        got = forward(runtime, [(r, [IDS[t]]) for r in runs])
        for out, model in zip(got, models, strict=True):
            assert (out[0] - logits_of(model, IDS[: t + 1])[-1]).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize(
    "options",
    [
        {"use_rslora": True},
        {"rank_pattern": {"v_proj": 2, "layers.1.mlp.down_proj": 6}, "alpha_pattern": {"o_proj": 3}},
        {"layers_to_transform": [0, 2]},
    ],
    ids=["rslora", "patterns", "some-layers"],
)
def test_peft_scaling_rules(runtime, tmp_path, options):
    path, merged = make_peft_adapter(tmp_path / "a", seed=3, r=4, alpha=16, **options)
    adapter = loaded(runtime, "rules", path)
    (got,) = forward(runtime, [(runtime.new_run(adapter=adapter), IDS)])
    assert (got - logits_of(merged, IDS)).abs().max().item() <= TOLERANCE


def test_scale_multiplies_the_update(runtime, adapters):
    path, merged = adapters["one"]
    half = loaded(runtime, "half", path, 0.5)
    (got,) = forward(runtime, [(runtime.new_run(adapter=half), IDS)])
    reference = _merged_with_scale(path, 0.5)
    assert (got - logits_of(reference, IDS)).abs().max().item() <= TOLERANCE
    assert (got - logits_of(merged, IDS)).abs().max().item() > 100 * TOLERANCE
    runtime.adapters.remove("half")


def _merged_with_scale(path, scale):
    from peft import PeftModel

    model = PeftModel.from_pretrained(tiny_hf("llama"), str(path))
    for module in model.modules():
        if hasattr(module, "scaling") and isinstance(module.scaling, dict):
            for key in module.scaling:
                module.scaling[key] *= scale
    return model.merge_and_unload().eval()


def test_more_adapters_than_resident_still_one_step(runtime, adapters, tmp_path):
    (p1, m1), (p2, m2) = adapters["one"], adapters["two"]
    p3, m3 = make_peft_adapter(tmp_path / "three", seed=4, r=2, alpha=2)
    a1, a2, a3 = loaded(runtime, "one", p1), loaded(runtime, "two", p2), loaded(runtime, "three", p3)
    bank = runtime.adapters
    bank.max_loras = 1
    try:
        # "three" (seed 4) is new to this worker's runtime: swapping it in alone leaves it the only resident one,
        # whatever earlier tests left resident (the test passed or failed by the order xdist ran them in)
        forward(runtime, [(runtime.new_run(adapter=a3), IDS)])
        assert bank.resident == [a3.identity]
        before = bank.swaps_in
        got = forward(
            runtime,
            [(runtime.new_run(adapter=a), IDS) for a in (a1, a2, a3)] + [(runtime.new_run(), IDS)],
        )
        assert len(bank.resident) == 1
        assert bank.swaps_in - before == 3  # swapped in one after the other, "three" again after the others
    finally:
        bank.max_loras = 4
    for out, model in zip(got, [m1, m2, m3, tiny_hf("llama")], strict=True):
        assert (out - logits_of(model, IDS)).abs().max().item() <= TOLERANCE


def test_gguf_lora_file_equals_peft_directory(runtime, adapters, tmp_path):
    path, merged = adapters["one"]
    gguf_path = write_gguf_lora(path, tmp_path / "one.gguf", runtime._model.config)
    adapter = loaded(runtime, "one-gguf", gguf_path)
    (got,) = forward(runtime, [(runtime.new_run(adapter=adapter), IDS)])
    assert (got - logits_of(merged, IDS)).abs().max().item() <= TOLERANCE
    assert adapter.identity == runtime.adapters.read("x", str(path)).identity  # the same update, the same identity
    runtime.adapters.remove("one-gguf")


def test_identity_is_weights_and_scale_not_name(runtime, adapters):
    path, _ = adapters["one"]
    a = runtime.adapters.read("a", str(path))
    b = runtime.adapters.read("b", str(path))
    assert a.identity == b.identity and a.name != b.name
    assert runtime.adapters.read("a", str(path), 2.0).identity != a.identity
    other = runtime.adapters.read("a", str(adapters["two"][0]))
    assert other.identity != a.identity
    assert a.namespace_component == ("lora", a.identity)
    assert a.identity == adapter_identity(a.modules)


def test_int8_batched_and_chunked_adapter_rows_are_bit_for_bit(tmp_path, adapters):
    """int8: an adapter's low-rank products are int8 products too, exact per token: a sequence computed in a batch
    beside others, its prompt cut into other chunks, stacked with other adapters (short steps) or alone on its
    gathered rows (long steps), gives the same bits as alone."""
    rt = load_model("tiny-llama", weights="int8")
    path, merged = adapters["one"]
    a1 = loaded(rt, "one", path)
    a2 = loaded(rt, "two", adapters["two"][0])
    ids = IDS * 3  # 42 tokens: one step of them computes per adapter, shorter steps stacked
    assert len(ids) > STACKED_ROWS >= 5 + 4 + 3 + 8
    (alone,) = forward(rt, [(rt.new_run(adapter=a1), ids)])
    chunked = rt.new_run(adapter=a1)
    first = forward(rt, [(chunked, ids[:5]), (rt.new_run(adapter=a2), IDS[:4]), (rt.new_run(), IDS[:3])])[0]
    middle = forward(rt, [(chunked, ids[5:13])])[0]
    rest = forward(rt, [(chunked, ids[13:]), (rt.new_run(adapter=a2), ids), (rt.new_run(), IDS[:3])])[0]
    assert torch.equal(torch.cat([first, middle, rest]), alone)
    close = (alone[: len(IDS)] - logits_of(merged, IDS)).abs().max().item()
    base = (logits_of(tiny_hf("llama"), IDS) - logits_of(merged, IDS)).abs().max().item()
    assert close < base / 4  # int8 follows the adapter, not the base


def test_unknown_and_removed_names(runtime, adapters):
    with pytest.raises(UnknownAdapterError):
        runtime.adapters.get("nobody")
    adapter = loaded(runtime, "gone", adapters["one"][0])
    run = runtime.new_run(adapter=adapter)
    runtime.adapters.remove("gone")
    with pytest.raises(UnknownAdapterError):
        runtime.adapters.remove("gone")
    forward(runtime, [(run, IDS)])  # a run begun under it finishes with it


def test_name_taken_without_replace(runtime, adapters):
    adapter = runtime.adapters.read("taken", str(adapters["one"][0]))
    runtime.adapters.add(adapter)
    with pytest.raises(ValueError, match="already loaded"):
        runtime.adapters.add(adapter)
    runtime.adapters.remove("taken")


# ==================================================================== refusals


def test_shapes_of_another_model_are_refused_naming_the_module(runtime, adapters, tmp_path):
    out = _copy_adapter(adapters["one"][0], tmp_path / "narrow")  # as if made for a model with k of 16 rows
    tensors = load_file(str(out / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.2.self_attn.k_proj.lora_B.weight"
    tensors[key] = tensors[key][:16].contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    with pytest.raises(AdapterMismatchError, match=r"layers\.2\.k") as info:
        runtime.adapters.read("narrow", str(out))
    assert info.value.module == "layers.2.k"


def test_layer_past_the_model_is_refused(runtime, adapters, tmp_path):
    src, _ = adapters["one"]
    out = _copy_adapter(src, tmp_path / "deep")
    tensors = load_file(str(out / "adapter_model.safetensors"))
    renamed = {k.replace("layers.3.", "layers.7."): v for k, v in tensors.items()}
    save_file(renamed, str(out / "adapter_model.safetensors"))
    with pytest.raises(AdapterMismatchError, match=r"layers\.7\.") as info:
        runtime.adapters.read("deep", str(out))
    assert "4 layers" in str(info.value)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_dora": True}, "use_dora"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "all"}, "bias"),
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_settings_not_served_are_refused(runtime, adapters, tmp_path, change, message):
    out = _copy_adapter(adapters["one"][0], tmp_path / "x")
    config = json.loads((out / "adapter_config.json").read_text())
    config.update(change)
    (out / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterFileError, match=message):
        runtime.adapters.read("x", str(out))


def test_bad_paths_and_files(runtime, adapters, tmp_path):
    with pytest.raises(AdapterFileError, match="no such adapter"):
        runtime.adapters.read("x", str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AdapterFileError, match=r"adapter_config\.json"):
        runtime.adapters.read("x", str(empty))
    out = _copy_adapter(adapters["one"][0], tmp_path / "corrupt")
    (out / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(AdapterFileError, match="safetensors"):
        runtime.adapters.read("x", str(out))
    (out / "adapter_config.json").write_text("{")
    with pytest.raises(AdapterFileError, match="JSON"):
        runtime.adapters.read("x", str(out))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 7)
    with pytest.raises(AdapterFileError):
        runtime.adapters.read("x", str(junk))
    with pytest.raises(AdapterFileError, match="finite"):
        runtime.adapters.read("x", str(adapters["one"][0]), math.inf)


def test_embedding_or_head_modules_are_refused(runtime, adapters, tmp_path):
    out = _copy_adapter(adapters["one"][0], tmp_path / "head")
    tensors = load_file(str(out / "adapter_model.safetensors"))
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 64)
    tensors["base_model.model.lm_head.lora_B.weight"] = torch.zeros(10, 4)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    with pytest.raises(AdapterFileError, match="lm_head"):
        runtime.adapters.read("x", str(out))


def test_a_gguf_model_file_is_not_an_adapter(runtime, tmp_path):
    import gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type("model")
    writer.add_tensor("blk.0.attn_q.weight", torch.zeros(64, 64).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(AdapterFileError, match="not a GGUF LoRA adapter"):
        runtime.adapters.read("x", str(path))


def test_transformers_forward_models_have_no_adapters():
    rt = load_model("tiny-qwen3next")
    assert getattr(rt, "adapters", None) is None


def _copy_adapter(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


# ==================================================================== a GGUF base in its own blocks


@pytest.fixture(scope="module")
def gguf_base(tmp_path_factory):
    """A tiny wide llama written as a Q8_0 GGUF file, a PEFT adapter of it and the same adapter as a GGUF LoRA."""
    from chat.models.kernels import block_matrices
    from tests.chat.models.gguf_helpers import reference_wide_llama, write_tiny_gguf

    if block_matrices.kernels() is None:
        pytest.skip("no native block kernels on this machine")
    folder = tmp_path_factory.mktemp("gguf-lora")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TURNCACHE_HOME", str(folder / "home"))
        reference = reference_wide_llama()
        model_file = write_tiny_gguf(folder / "wide.gguf", reference, qtype="Q8_0")
        peft_dir, merged = make_peft_adapter_on(reference, folder / "peft")
        lora_file = write_gguf_lora(peft_dir, folder / "lora.gguf", reference.config)
        yield model_file, peft_dir, lora_file, merged


def make_peft_adapter_on(model, where):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(9)
    config = LoraConfig(r=8, lora_alpha=16, init_lora_weights=False, target_modules=["q_proj", "k_proj", "up_proj"])
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(where))
    return where, peft_model.merge_and_unload().eval()


@pytest.mark.parametrize("weights", ["gguf", "gguf-q8", "gguf-q16"])
def test_block_formats_with_an_adapter_are_bit_for_bit_across_chunks_and_batches(gguf_base, weights):
    model_file, peft_dir, lora_file, merged = gguf_base
    rt = load_model(str(model_file), weights=weights)
    from_peft, from_gguf = rt.adapters.read("p", str(peft_dir)), rt.adapters.read("g", str(lora_file))
    assert from_peft.identity == from_gguf.identity  # llama.cpp's q/k row order put back: the same update
    ids = (IDS * 4)[:50]
    (whole,) = forward(rt, [(rt.new_run(adapter=from_peft), ids)])
    run = rt.new_run(adapter=from_gguf)
    pieces = [forward(rt, [(run, ids[:7]), (rt.new_run(), ids[:5])])[0]]
    pieces += [forward(rt, [(run, [t]), (rt.new_run(adapter=from_peft), ids[:3])])[0] for t in ids[7:12]]
    pieces.append(forward(rt, [(run, ids[12:])])[0])
    assert torch.equal(torch.cat(pieces), whole)
    base = rt.new_run()
    (plain,) = forward(rt, [(base, ids)])
    tolerance = (plain - logits_of(merged, ids)).abs().max().item()
    assert (whole - logits_of(merged, ids)).abs().max().item() < tolerance  # nearer the merged model than the base


def test_a_cache_hit_under_an_adapter_in_the_gguf_default_is_bit_for_bit(gguf_base):
    """A GGUF file's default format (gguf-q16): a turn under an adapter that starts from its cached prefix computes
    the same bits as the turn without the cache, and the same reply."""
    from cache import PrefixCache
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams
    from tests.chat.engine.recording import run_recorded

    model_file, peft_dir, _, _ = gguf_base
    rt = load_model(str(model_file))
    assert rt.weights == "gguf-q16"
    adapter = rt.adapters.read("p", str(peft_dir))
    cache = PrefixCache()
    messages: list[dict] = [{"role": "system", "content": "a cat sat on the mat while two dogs ran far from home"}]
    hits = 0
    for i in range(3):
        messages.append({"role": "user", "content": f"question {i} about the dogs"})
        request = TurnRequest(list(messages), SamplingParams(max_tokens=4), adapter=adapter)
        _, cached, cached_logits = run_recorded(rt, cache, request, budget=16)
        _, fresh, fresh_logits = run_recorded(rt, None, request, budget=16)
        start = cached.usage.cached_tokens
        hits += start > 0
        assert cached.token_ids == fresh.token_ids
        assert torch.equal(cached_logits, fresh_logits[start:])
        messages.append({"role": "assistant", "content": cached.text})
    assert hits == 2  # turns 2 and 3 started from the entries of turns 1 and 2
