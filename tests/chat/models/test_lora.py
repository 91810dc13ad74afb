"""LoRA adapters on the own decoder, across its modules (decoder.runtime, decoder.lora, lora_files): a turn under an
adapter computes what the model with the adapter merged into its weights computes (float32, 1e-4), alone, in one
forward beside other adapters and the base, and token by token; a GGUF base in its own blocks under an adapter. The
module's own cases are in decoder/test_lora.py (identity, bank, residency, fit checks, int8 rows) and
test_lora_files.py (reading and refusing files)."""

from __future__ import annotations

import pytest
import torch

from chat.models import load_model
from tests.chat.models.lora_helpers import IDS, TOLERANCE, forward, loaded, logits_of, tiny_hf, write_gguf_lora

pytest.importorskip("peft")


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


# ==================================================================== refusals


def test_transformers_forward_models_have_no_adapters():
    rt = load_model("tiny-qwen3next")
    assert getattr(rt, "adapters", None) is None


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
