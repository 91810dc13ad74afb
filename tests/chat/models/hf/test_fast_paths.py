"""chat.models.hf.fast_paths: linear layers in each weight format compute what the stock layers compute (float32 up to
rounding, bfloat16 and int8 up to their precision), float32 shares the stock parameters, fused groups hold their
values once, and int8 gives a token the same result whatever else is in the batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from chat.models.hf import ragged
from chat.models.hf.fast_paths import FastLinear, FusedPart, install
from chat.models.kernels.dense_matrices import (
    BFloat16Matrix,
    BlasForms,
    Int8Matrix,
    calibrate,
    int8_linear,
    linear,
    quantize_weight,
)
from chat.models.tiny.text import build_tiny_model, tiny_config

torch.set_num_threads(1)

ALL_KERNELS = [BlasForms(one, few) for one in (False, True) for few in (False, True)]


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
    fast = install(block, "float32", calibrate_kernels=False)
    assert storage_bytes(block) == before  # the parts' weights are views of one fused matrix
    assert sorted(fast.fused_names) == ["attn.k_proj", "attn.q_proj", "attn.v_proj", "gate_proj", "up_proj"]
    assert isinstance(block.attn.o_proj, FastLinear) and not isinstance(block.attn.o_proj, FusedPart)
    assert type(block.narrow) is nn.Linear
    assert fast.attention == []  # no config: no attention to switch
    attn = block.attn
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)  # one product for the three
    assert close(q, want["attn.q_proj"]) and close(k, want["attn.k_proj"]) and close(v, want["attn.v_proj"])
    assert attn.q_proj._group.output is None  # released once every part took its slice
    assert close(attn.v_proj(x), want["attn.v_proj"])  # called alone (no q_proj first): computes its own slice
    assert close(attn.k_proj(y), stock["attn.k_proj"](y))  # another input than q_proj's
    attn.q_proj(x)
    assert close(attn.k_proj(y), stock["attn.k_proj"](y))  # q_proj's result is for x, not y
    assert close(block.gate_proj(x), want["gate_proj"]) and close(block.up_proj(x), want["up_proj"])
    assert close(attn.o_proj(x), want["attn.o_proj"])


def test_a_tied_or_shared_layer_is_not_fused():
    block = Block()
    block.up_proj.weight = block.gate_proj.weight  # tied
    fast = install(block, "float32", calibrate_kernels=False)
    assert "gate_proj" not in fast.fused_names and isinstance(block.gate_proj, FastLinear)


# ==================================================================== a whole model


@pytest.fixture
def tiny_llama():
    def build():
        special = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": None}
        return build_tiny_model(tiny_config("llama", 100, special), torch.float32)

    return build


def test_a_rewritten_model_gives_the_stock_logits(tiny_llama):
    model = tiny_llama()
    ids = torch.tensor([[5, 17, 3, 99, 42, 8]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        fast = install(model, "float32", calibrate_kernels=False)
        assert model.config._attn_implementation == ragged.RAGGED_ATTENTION and fast.attention == [
            (model.config, "sdpa")
        ]
        assert len(fast.fused_names) == 4 * 5  # q/k/v and gate/up of 4 layers
        got = model(input_ids=ids).logits  # outside a pack the ragged attention is SDPA
        assert close(got, want)


@pytest.mark.parametrize("weights,tol", [("bfloat16", 0.05), ("int8", 0.15)])
def test_other_formats_keep_only_their_own_weights(tiny_llama, weights, tol):
    model = tiny_llama()
    ids = torch.tensor([[5, 17, 3, 99, 42, 8]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        fast = install(model, weights)
        kind = BFloat16Matrix if weights == "bfloat16" else Int8Matrix
        layers = [m for m in model.modules() if isinstance(m, FastLinear)]
        assert layers and all(isinstance(m.matrix, kind) for m in layers)
        assert all(original is None for _, _, original, _ in fast.replaced)  # the float32 layers were let go
        got = model(input_ids=ids).logits
        assert 0 < (got - want).abs().max().item() <= tol  # a rounded, not an equal, function


def test_an_unknown_weight_format_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="int4"):
        install(tiny_llama(), "int4")


# ==================================================================== int8 and bfloat16 products


def test_int8_linear_is_the_product_of_its_quantized_operands(kernel_path):
    g = torch.Generator().manual_seed(3)
    weight, bias, x = torch.randn(40, 24, generator=g), torch.randn(40, generator=g), torch.randn(5, 24, generator=g)
    m = Int8Matrix(weight, bias)
    assert (m.packed is not None) == (kernel_path == "native") and (m.q is None) == (kernel_path == "native")
    q, scale = quantize_weight(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    amax = x.abs().amax(dim=1, keepdim=True)
    xq = torch.round(x * 127 / amax)
    want = (xq @ q.float().t()) * (amax / 127) * scale + bias
    assert close(m(x), want, 1e-4)
    assert torch.equal(m(x), int8_linear(x, q, scale, bias))  # both paths: the same arithmetic, bit for bit
    exact = F.linear(x, weight, bias)
    assert close(m(x), exact, 0.03 * exact.abs().max().item())  # and close to the float32 product


def test_int8_gives_a_token_the_same_result_in_any_batch(kernel_path):
    g = torch.Generator().manual_seed(4)
    m = Int8Matrix(torch.randn(64, 48, generator=g), None)
    rows = torch.randn(33, 48, generator=g)
    alone = torch.cat([m(rows[i : i + 1]) for i in range(33)])
    assert torch.equal(m(rows), alone) and torch.equal(m(rows.view(3, 11, 48)).view(33, 64), alone)


def test_int8_handles_a_row_of_zeros_and_leading_dimensions(kernel_path):
    m = Int8Matrix(torch.randn(8, 4), None)
    out = m(torch.zeros(2, 3, 4))
    assert out.shape == (2, 3, 8) and torch.equal(out, torch.zeros(2, 3, 8))


@pytest.mark.parametrize("bounds", [[(0, 64), (64, 96), (96, 128)], [(0, 40), (40, 41), (41, 100)]])
def test_int8_parts_compute_their_own_columns(kernel_path, bounds):
    """A fused group's parts, called on their own: aligned parts read their slice of the packed weight, the others
    compute the group and keep their columns; either way they equal the group's columns."""
    g = torch.Generator().manual_seed(6)
    out_features = bounds[-1][1]
    group = Int8Matrix(torch.randn(out_features, 24, generator=g), torch.randn(out_features, generator=g))
    x = torch.randn(3, 24, generator=g)
    whole = group(x)
    for lo, hi in bounds:
        assert torch.equal(group.rows(lo, hi)(x), whole[:, lo:hi])


def test_bfloat16_matrix_is_close_to_the_float32_product():
    g = torch.Generator().manual_seed(5)
    weight, bias, x = torch.randn(40, 24, generator=g), torch.randn(40, generator=g), torch.randn(3, 24, generator=g)
    m = BFloat16Matrix(weight, bias)
    assert m.weight.dtype == torch.bfloat16 and m(x).dtype == torch.float32
    assert close(m(x), F.linear(x, weight, bias), 0.1)
    part = m.rows(8, 16)
    assert close(part(x), m(x)[:, 8:16], 1e-6)
