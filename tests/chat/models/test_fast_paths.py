"""The decode fast paths (chat.models.fast_paths) compute what the stock layers compute, share their parameters,
fall back where they do not apply, and step aside completely while a baseline holds the stock model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from chat.models import fast_paths
from chat.models.fast_paths import (
    ATTENTION_NAME,
    FastLinear,
    FastPaths,
    FusedPart,
    Kernels,
    calibrate,
    linear,
    short_query_attention,
)
from chat.models.tiny import build_tiny_model, tiny_config

torch.set_num_threads(1)

ALL_KERNELS = [Kernels(one, few) for one in (False, True) for few in (False, True)]


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and (a - b).abs().max().item() <= tol


# ==================================================================== linear kernels


@pytest.mark.parametrize("kernels", ALL_KERNELS, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 3, 24), (2, 5, 24), (1, 40, 24), (24,)])
@pytest.mark.parametrize("bias", [True, False])
def test_every_kernel_equals_f_linear(kernels, shape, bias):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 24, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    x = torch.randn(shape, generator=g)
    out = linear(x, weight, b, kernels)
    assert close(out, F.linear(x, weight, b)) and out.is_contiguous()


def test_calibration_picks_a_kernel_for_each_row_count():
    weights = [torch.randn(64, 32) for _ in range(3)]
    kernels = calibrate(weights, rounds=1)
    assert isinstance(kernels.one_as_gemm, bool) and isinstance(kernels.few_as_mm, bool)


class Attention(nn.Module):
    def __init__(self, width: int = 16, kv: int = 8, bias: bool = False) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, width, bias=bias)
        self.k_proj = nn.Linear(width, kv, bias=bias)
        self.v_proj = nn.Linear(width, kv, bias=bias)
        self.o_proj = nn.Linear(width, width, bias=bias)


class Block(nn.Module):
    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.attn = Attention(bias=bias)
        self.gate_proj = nn.Linear(16, 32, bias=False)
        self.up_proj = nn.Linear(16, 32, bias=False)
        self.narrow = nn.Linear(16, 16, bias=False).to(torch.bfloat16)  # not float32: left alone


def storage_bytes(module: nn.Module) -> int:
    seen = {}
    for p in module.parameters():
        s = p.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("bias", [True, False])
def test_fused_parts_give_the_stock_results_and_hold_the_values_once(bias):
    torch.manual_seed(0)
    block = Block(bias).eval()
    stock = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}
    x, y = torch.randn(1, 3, 16), torch.randn(1, 1, 16)
    want = {n: m(x) for n, m in stock.items() if m.weight.dtype == torch.float32}
    before = storage_bytes(block)
    fast = FastPaths.apply(block, calibrate_kernels=False)
    assert storage_bytes(block) == before  # the parts' weights are views of one fused matrix
    assert sorted(fast.fused_names) == ["attn.k_proj", "attn.q_proj", "attn.v_proj", "gate_proj", "up_proj"]
    assert isinstance(block.attn.o_proj, FastLinear) and not isinstance(block.attn.o_proj, FusedPart)
    assert type(block.narrow) is nn.Linear
    assert fast.attention == []  # no config: no attention to switch
    attn = block.attn
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)  # one product for the three
    assert close(q, want["attn.q_proj"]) and close(k, want["attn.k_proj"]) and close(v, want["attn.v_proj"])
    assert attn.q_proj._fused.output is None  # released once every part took its slice
    assert close(attn.v_proj(x), want["attn.v_proj"])  # called alone (no q_proj first): computes its own slice
    assert close(attn.k_proj(y), stock["attn.k_proj"](y))  # another input than q_proj's
    attn.q_proj(x)
    assert close(attn.k_proj(y), stock["attn.k_proj"](y))  # q_proj's result is for x, not y
    assert close(block.gate_proj(x), want["gate_proj"]) and close(block.up_proj(x), want["up_proj"])
    assert close(attn.o_proj(x), want["attn.o_proj"])


def test_stock_puts_back_the_original_layers_with_the_same_values():
    torch.manual_seed(0)
    block = Block().eval()
    originals = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}
    values = {n: m.weight.detach().clone() for n, m in originals.items()}
    fast = FastPaths.apply(block, calibrate_kernels=False)
    with fast.stock() as model:
        assert model is block
        now = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}
        assert all(type(m) is nn.Linear and m is originals[n] for n, m in now.items()) and now.keys() == values.keys()
        for n, m in now.items():
            assert m.weight.is_contiguous() and torch.equal(m.weight, values[n])
    assert isinstance(block.attn.q_proj, FusedPart)  # the fast layers are back


def test_a_tied_or_shared_layer_is_not_fused():
    block = Block()
    block.up_proj.weight = block.gate_proj.weight  # tied
    fast = FastPaths.apply(block, calibrate_kernels=False)
    assert "gate_proj" not in fast.fused_names and isinstance(block.gate_proj, FastLinear)


# ==================================================================== attention


def attention_inputs(q: int, heads: int, kv_heads: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q, 8, generator=g)
    key = torch.randn(1, kv_heads, length, 8, generator=g)
    value = torch.randn(1, kv_heads, length, 8, generator=g)
    module = nn.Module()
    module.num_key_value_groups = heads // kv_heads
    module.is_causal = True
    return module, query, key, value


def causal_mask(q: int, length: int) -> torch.Tensor:
    """True = attend: query i (at position length - q + i) sees positions <= its own."""
    pos = torch.arange(length)
    return (pos[None, :] <= (length - q + torch.arange(q))[:, None]).view(1, 1, q, length)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (9, 3)])
@pytest.mark.parametrize("q,mask_kind", [(1, "none"), (1, "bool"), (1, "float"), (4, "bool"), (4, "float")])
def test_short_query_attention_equals_sdpa(heads, kv_heads, mask_kind, q):
    module, query, key, value = attention_inputs(q, heads, kv_heads, length=37)
    mask = None
    if mask_kind != "none":
        mask = causal_mask(q, 37)
        if mask_kind == "float":
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, weights = short_query_attention(module, query, key, value, mask, scaling=0.3)
    assert weights is None and got.shape == (1, q, heads, 8) and close(got, want, 1e-6)


def test_short_query_attention_takes_a_per_head_mask():
    module, query, key, value = attention_inputs(2, 6, 2, length=20)
    mask = causal_mask(2, 20).expand(1, 6, 2, 20).clone()
    mask[:, 3, :, :5] = False  # one head sees less
    want, _ = sdpa_attention_forward(module, query, key, value, mask)
    got, _ = short_query_attention(module, query, key, value, mask)
    assert close(got, want, 1e-6)


def test_other_calls_go_to_sdpa_unchanged(monkeypatch):
    calls = []
    real = fast_paths.sdpa_attention_forward
    monkeypatch.setattr(fast_paths, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    module, query, key, value = attention_inputs(20, 4, 2, length=20)  # a long query (prefill)
    got, _ = short_query_attention(module, query, key, value, None)
    assert torch.equal(got, real(module, query, key, value, None)[0])
    module, query, key, value = attention_inputs(3, 4, 2, length=9)  # several queries, no mask
    short_query_attention(module, query, key, value, None)
    module, query, key, value = attention_inputs(1, 4, 2, length=9)
    short_query_attention(module, query.bfloat16(), key.bfloat16(), value.bfloat16(), None)  # not float32
    short_query_attention(module, query, key, value, None, position_bias=torch.zeros(1, 4, 1, 9))
    with pytest.raises(ValueError, match="softcap"):  # what SDPA says about soft-capping
        short_query_attention(module, query, key, value, None, softcap=30.0)
    assert len(calls) == 5
    calls.clear()
    short_query_attention(module, query, key, value, None, sliding_window=4, position_ids=None)  # ignored, as by SDPA
    assert calls == []


# ==================================================================== a whole model


@pytest.fixture
def tiny_llama():
    def build():
        special = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": None}
        return build_tiny_model(tiny_config("llama", 100, special), torch.float32)

    return build


def test_a_rewritten_model_gives_the_stock_logits_and_can_be_stock_again(tiny_llama):
    model = tiny_llama()
    ids = torch.tensor([[5, 17, 3, 99, 42, 8]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        fast = FastPaths.apply(model, calibrate_kernels=False)
        assert model.config._attn_implementation == ATTENTION_NAME and fast.attention == [model.config]
        assert len(fast.fused_names) == 4 * 5  # q/k/v and gate/up of 4 layers
        got = model(input_ids=ids).logits
        assert close(got, want)
        with fast.stock() as stock:
            assert stock.config._attn_implementation == "sdpa"
            assert not any(isinstance(m, FastLinear) for m in stock.modules())
            assert torch.equal(stock(input_ids=ids).logits, want)  # the very layers and values as loaded
        assert model.config._attn_implementation == ATTENTION_NAME
        assert close(model(input_ids=ids).logits, want)


def test_one_token_steps_use_the_matmul_attention(tiny_llama, monkeypatch):
    from transformers import DynamicCache

    model = tiny_llama()
    FastPaths.apply(model, calibrate_kernels=False)
    used = []
    real = fast_paths.sdpa_attention_forward
    monkeypatch.setattr(fast_paths, "sdpa_attention_forward", lambda *a, **k: used.append("sdpa") or real(*a, **k))
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([[5, 17, 3]]), past_key_values=cache, use_cache=True)
        assert used == ["sdpa"] * 4  # the prefill: SDPA in each of 4 layers
        used.clear()
        model(input_ids=torch.tensor([[8]]), past_key_values=cache, use_cache=True)
        assert used == []
