"""chat.models.decoder.lora on its own: an adapter's identity, the bank's names and residency, the fit checks against
the base model, and the int8 low-rank products (stacked for short steps, per adapter for long ones) giving a row the
same bits. The turns that equal the merged model are in tests/chat/models/test_lora.py; reading files in
test_lora_files.py."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from chat.models import load_model
from chat.models.decoder.lora import STACKED_ROWS, adapter_identity
from chat.models.errors import AdapterMismatchError, UnknownAdapterError
from tests.chat.models.lora_helpers import (
    IDS,
    TOLERANCE,
    copy_adapter,
    forward,
    loaded,
    logits_of,
    make_peft_adapter,
    tiny_hf,
)

pytest.importorskip("peft")


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


def test_shapes_of_another_model_are_refused_naming_the_module(runtime, adapters, tmp_path):
    out = copy_adapter(adapters["one"][0], tmp_path / "narrow")  # as if made for a model with k of 16 rows
    tensors = load_file(str(out / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.2.self_attn.k_proj.lora_B.weight"
    tensors[key] = tensors[key][:16].contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    with pytest.raises(AdapterMismatchError, match=r"layers\.2\.k") as info:
        runtime.adapters.read("narrow", str(out))
    assert info.value.module == "layers.2.k"


def test_layer_past_the_model_is_refused(runtime, adapters, tmp_path):
    src, _ = adapters["one"]
    out = copy_adapter(src, tmp_path / "deep")
    tensors = load_file(str(out / "adapter_model.safetensors"))
    renamed = {k.replace("layers.3.", "layers.7."): v for k, v in tensors.items()}
    save_file(renamed, str(out / "adapter_model.safetensors"))
    with pytest.raises(AdapterMismatchError, match=r"layers\.7\.") as info:
        runtime.adapters.read("deep", str(out))
    assert "4 layers" in str(info.value)
