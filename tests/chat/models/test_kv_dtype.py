"""Attention K/V stored in float16 (``kv_dtype``): the default of int8 models where the native kernels run; half the
bytes of float32 rows; logits close to those of float32 rows; the same on torch's path as in the kernel; and, with
int8 weights, a restored prefix still gives bit for bit the logits of the uncached run."""

from __future__ import annotations

import pytest
import torch

from cache import PrefixCache
from chat.models import load_model
from chat.models.kernels import native
from tests.chat.models.helpers import forward_pieces, full_logits, max_diff, random_tokens, restored_logits, store

needs_kernels = pytest.mark.skipif(native.kernels() is None, reason="no native kernels on this machine")


def stored_rows(model, tokens: list[int]) -> list[torch.Tensor]:
    """The K/V tensors of an entry that a run over ``tokens`` exports."""
    run = model.new_run()
    try:
        model.forward(run, tokens)
        return [
            t
            for state in model.export(run)
            for t in (getattr(state, "keys", None), getattr(state, "values", None))
            if t is not None
        ]
    finally:
        model.close_run(run)


@needs_kernels
def test_int8_models_store_float16_kv_by_default_and_other_formats_their_dtype():
    int8, fp32 = load_model("tiny-llama", weights="int8"), load_model("tiny-llama")
    assert (int8.dtype, fp32.dtype) == ("float16", "float32")  # the cache namespace's dtype is the rows' dtype
    tokens = random_tokens(fp32, 40, seed=1)
    half, full = stored_rows(int8, tokens), stored_rows(fp32, tokens)
    assert {t.dtype for t in half} == {torch.float16} and {t.dtype for t in full} == {torch.float32}
    assert sum(t.nbytes for t in half) * 2 == sum(t.nbytes for t in full)
    with native.disabled():  # torch's path would convert float16 rows at every step: int8 keeps float32 there
        assert load_model("tiny-llama", weights="int8").dtype == "float32"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_float16_kv_give_logits_close_to_float32_kv(name):
    tokens = random_tokens(load_model(name), 60, seed=2)
    want = full_logits(load_model(name), tokens)
    half = load_model(name, kv_dtype="float16")
    run = half.new_run()
    got = forward_pieces(half, run, tokens)  # a chunk, decode steps, the rest
    half.close_run(run)
    assert 0 < max_diff(got, want) < 2e-3 * want.abs().max().item()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_kernels
def test_float16_kv_on_torchs_path_give_what_the_kernel_gives():
    kernel = load_model("tiny-gemma3", kv_dtype="float16")  # sliding layers too
    tokens = random_tokens(kernel, 50, seed=3)
    run = kernel.new_run()
    want = forward_pieces(kernel, run, tokens)
    kernel.close_run(run)
    with native.disabled():
        torch_path = load_model("tiny-gemma3", kv_dtype="float16")
        run = torch_path.new_run()
        got = forward_pieces(torch_path, run, tokens)
        torch_path.close_run(run)
    assert max_diff(got, want) < 1e-4


@needs_kernels
def test_a_restored_prefix_of_float16_rows_is_exact_with_int8_weights():
    model = load_model("tiny-llama", weights="int8")
    assert model.dtype == "float16"
    tokens = random_tokens(model, 70, seed=4)
    cache = PrefixCache()
    store(model, cache, tokens[:45])
    hit, rest = restored_logits(model, cache, tokens, pieces=(1, 1, 3))
    assert hit == 45
    assert torch.equal(rest, full_logits(model, tokens)[hit:])  # bit for bit
