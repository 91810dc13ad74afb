"""chat.models.kernels.dense_matrices: the float32, bfloat16 and int8 weight formats against the definition of each
(x @ W.T + b, with the rounding the format names), their row slices, and int8's per-token exactness, with the
native kernels and on torch's operations (the kernel_path fixture)."""

from __future__ import annotations

import pytest
import torch

from chat.models.kernels.dense_matrices import (
    FEW_ROWS,
    BFloat16Matrix,
    BlasForms,
    Float32Matrix,
    Int8Matrix,
    int8_linear,
    quantize_weight,
)

torch.set_num_threads(1)
OUT, IN = 48, 64  # 48 channels: rows(16, 40) starts on the native kernel's channel block, rows(5, 30) does not


def weight_and_bias(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(OUT, IN, generator=g), torch.randn(OUT, generator=g)


def activations(rows: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, IN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 3])
def test_float32_is_the_linear_layer_in_every_blas_form(rows):
    weight, bias = weight_and_bias()
    x = activations(rows)
    expected = x @ weight.T + bias
    for forms in (BlasForms(False, False), BlasForms(True, True)):
        matrix = Float32Matrix(weight, bias)
        matrix.forms = forms
        torch.testing.assert_close(matrix(x), expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_rounds_weights_and_activations_and_answers_in_float32():
    weight, bias = weight_and_bias()
    x = activations(3)
    out = BFloat16Matrix(weight, bias)(x)
    assert out.dtype == torch.float32
    expected = (x.bfloat16() @ weight.bfloat16().T).float() + bias
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


def test_int8_is_per_token_quantization_times_per_channel_weights(kernel_path):
    weight, bias = weight_and_bias()
    x = activations(4)
    q, scale = quantize_weight(weight)
    assert q.dtype == torch.int8 and int(q.abs().amax(dim=1).min()) == 127  # each channel spans [-127, 127]
    amax = x.abs().amax(dim=1, keepdim=True)
    xq = torch.round(x / amax * 127)
    expected = (xq @ q.float().T) * (amax / 127) * scale + bias  # x ~ xq * amax / 127, W ~ q * scale
    torch.testing.assert_close(Int8Matrix(weight, bias)(x), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(int8_linear(x, q, scale, bias), expected, rtol=1e-5, atol=1e-4)


def test_an_int8_tokens_result_does_not_depend_on_its_batch(kernel_path):
    weight, bias = weight_and_bias()
    matrix = Int8Matrix(weight, bias)
    x = activations(7)
    together = matrix(x)
    for i in range(7):
        assert torch.equal(matrix(x[i : i + 1]), together[i : i + 1])


@pytest.mark.parametrize("make", [Float32Matrix, BFloat16Matrix, Int8Matrix])
@pytest.mark.parametrize(("lo", "hi"), [(16, 40), (5, 30)])
def test_rows_are_the_output_channels_of_the_whole(make, lo, hi, kernel_path):
    weight, bias = weight_and_bias()
    x = activations(3)
    matrix = make(weight, bias)
    torch.testing.assert_close(matrix.rows(lo, hi)(x), matrix(x)[:, lo:hi], rtol=1e-6, atol=1e-6)
