"""The dense weight formats: ``float32`` (:class:`Float32Matrix`), ``bfloat16`` (:class:`BFloat16Matrix`) and
``int8`` (:class:`Int8Matrix`), each a matrix class of the interface :mod:`chat.models.kernels.matrices` describes, and
the BLAS forms float32 calibrates per shape. The table of every format (these and a GGUF file's blocks,
:mod:`chat.models.kernels.block_matrices`) is :data:`chat.models.kernels.matrices.MATRICES`: both families are imported
by it, and neither imports it (no circle).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chat.models.kernels import native

FEW_ROWS = 16  # most rows (tokens) a float32 matrix runs with its calibrated few-rows form, or fused
_CALIBRATION_ROWS = 5  # rows the few-rows forms are timed with (a verification of 4 draft tokens)
_CALIBRATION_ROUNDS = 5  # interleaved timing rounds per shape; the fastest round counts


# ==================================================================== float32 BLAS forms


@dataclass(slots=True)
class BlasForms:
    """Which BLAS form a float32 weight shape runs with (see the module docstring)."""

    one_as_gemm: bool = False  # one row: a two-row torch.mm instead of F.linear
    few_as_mm: bool = True  # 2..FEW_ROWS rows: torch.mm(weight, x.T) instead of F.linear


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, forms: BlasForms) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the BLAS form ``forms`` picks for ``x``'s number of rows."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 1 and forms.one_as_gemm:
        flat = x.reshape(1, -1)
        out = _mm_t(weight, torch.cat([flat, flat]), bias)[:1]  # [1, out]
    elif 1 < rows <= FEW_ROWS and forms.few_as_mm:
        out = _mm_t(weight, x.reshape(rows, -1), bias)  # [rows, out]
    else:
        return F.linear(x, weight, bias)
    return out.contiguous().view(*x.shape[:-1], weight.shape[0])


def _mm_t(weight: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``rows @ weight.T (+ bias)`` as ``(weight @ rows.T).T``: ``[n, out]``, not contiguous."""
    if bias is None:
        return torch.mm(weight, rows.t()).t()
    return torch.addmm(bias.unsqueeze(1), weight, rows.t()).t()


def calibrate(weights: Sequence[torch.Tensor], rounds: int = _CALIBRATION_ROUNDS) -> BlasForms:
    """Time both forms for one row and for a few rows on ``weights`` (all of one shape, used in turn so that they
    come from memory as in a forward) and keep the faster of each."""
    k = weights[0].shape[1]
    one, two, few = (torch.ones(n, k, dtype=weights[0].dtype, device=weights[0].device) for n in (1, 2, 5))
    forms = {
        "one_linear": lambda w: F.linear(one, w),
        "one_gemm": lambda w: torch.mm(w, two.t()),
        "few_linear": lambda w: F.linear(few, w),
        "few_mm": lambda w: torch.mm(w, few.t()),
    }
    best = dict.fromkeys(forms, float("inf"))
    with torch.inference_mode():
        for _ in range(rounds):
            for name, form in forms.items():
                start = time.perf_counter()
                for w in weights:
                    form(w)
                best[name] = min(best[name], time.perf_counter() - start)
    return BlasForms(one_as_gemm=best["one_gemm"] < best["one_linear"], few_as_mm=best["few_mm"] < best["few_linear"])


# ==================================================================== matrices, one per format


class Float32Matrix:
    """A float32 ``[out, in]`` weight (row-major, as loaded) and its calibrated BLAS forms."""

    fuse_rows = FEW_ROWS  # most rows for which a fused group computes all parts at once

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight  # [out, in] float32 (a Parameter, or a view of a fused matrix)
        self.bias = bias  # [out] or None
        self.forms = BlasForms()  # set by calibration

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.forms)

    def rows(self, lo: int, hi: int) -> Float32Matrix:
        part = Float32Matrix(self.weight[lo:hi], None if self.bias is None else self.bias[lo:hi])
        part.forms = self.forms
        return part


class BFloat16Matrix:
    """A bfloat16 ``[out, in]`` weight; products are computed in bf16 and returned as float32."""

    fuse_rows = FEW_ROWS

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.detach().to(torch.bfloat16).contiguous()  # [out, in]
        self.bias = None if bias is None else bias.detach().float()  # [out], added in float32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x.to(torch.bfloat16), self.weight).float()
        return out if self.bias is None else out + self.bias

    def rows(self, lo: int, hi: int) -> BFloat16Matrix:
        part = BFloat16Matrix.__new__(BFloat16Matrix)
        part.weight, part.bias = self.weight[lo:hi], None if self.bias is None else self.bias[lo:hi]
        return part


class Int8Matrix:
    """An int8 ``[out, in]`` weight with one float32 scale per output channel (symmetric); see :func:`int8_linear`.

    With the native kernels (:mod:`chat.models.kernels.native`) the weight is kept only in their packed layout and every
    product runs there (the same numbers, bit for bit); without them, row-major for ``torch._int_mm``."""

    fuse_rows = 1 << 30  # always fused: the activations are quantized once for the whole group

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        q, scale = quantize_weight(weight)
        self.in_features = q.shape[1]
        self.scale = scale  # [out] float32
        self.bias = None if bias is None else bias.detach().float()  # [out]
        self._step = scale / 127.0  # weight step x activation step per unit of |x| max: what int32 sums are worth
        self.kernels = native.kernels()
        self.q: torch.Tensor | None = None  # [out, in] int8 for torch._int_mm (without the native kernels)
        self.packed: torch.Tensor | None = None  # the native kernels' layout of q (with them)
        self.wsum: torch.Tensor | None = None  # [out] int32: q's row sums, which the native kernel needs
        self.columns: tuple[int, int] | None = None  # a part that computes its whole group: its outputs in there
        if self.kernels is None:
            self.q = q
        else:
            self.packed, self.wsum = self.kernels.pack_int8(q), q.sum(dim=1, dtype=torch.int32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            assert self.q is not None
            return int8_linear(x, self.q, self.scale, self.bias, step=self._step)
        assert self.packed is not None and self.wsum is not None
        rows = x.reshape(-1, x.shape[-1])
        if rows.stride(-1) != 1 or rows.dtype != torch.float32:
            rows = rows.float().contiguous()
        out = self.kernels.int8_linear(rows, self.packed, self.wsum, self._step, self.bias)
        if self.columns is not None:
            out = out[:, self.columns[0] : self.columns[1]].contiguous()
        return out.view(*x.shape[:-1], out.shape[-1])

    def rows(self, lo: int, hi: int) -> Int8Matrix:
        """Output channels ``[lo, hi)`` as a matrix of their own, sharing this one's memory."""
        part = Int8Matrix.__new__(Int8Matrix)
        part.kernels, part.columns, part.in_features = self.kernels, None, self.in_features
        part.scale, part._step = self.scale[lo:hi], self._step[lo:hi]
        part.bias = None if self.bias is None else self.bias[lo:hi]
        part.q = None if self.q is None else self.q[lo:hi]
        part.packed, part.wsum = self.packed, self.wsum
        if self.packed is not None and self.wsum is not None:
            if lo % native.INT8_CHANNEL_ALIGN == 0:  # the packed rows of these channels start where they are
                assert self.q is None
                part.packed = self.packed[native.packed_offset(lo, self.in_features) :]
                part.wsum = self.wsum[lo:hi]
            else:  # computes its whole group and keeps its columns (only when called apart from its group)
                part._step, part.bias, part.columns = self._step, self.bias, (lo, hi)
        return part


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: int8 ``[out, in]`` (row-major) and float32 ``[out]`` with ``weight ~ q * scale[:, None]``, each
    output channel scaled so that its absolute maximum is 127."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [out]: the weight's quantization step per channel
    return torch.round(w / scale.unsqueeze(1)).to(torch.int8), scale


def int8_linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    step: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ (q * scale[:, None]).T (+ bias)`` with ``x`` quantized per token: each row of ``x`` is scaled so that its
    absolute maximum is 127, rounded to int8, multiplied by the int8 weights with int32 accumulation
    (``torch._int_mm``), and scaled back. Float32 in, float32 out. ``step`` (= ``scale / 127``) may be passed
    precomputed. Written with as few tensor operations as the arithmetic allows: a decode step calls it ~120 times,
    and each operation costs about a microsecond of dispatch."""
    rows = x.reshape(-1, x.shape[-1])  # [m, in]
    amax = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12)  # [m, 1]
    quantized = rows.div(amax).mul_(127.0).round_().to(torch.int8)  # |values| <= 127
    out = torch._int_mm(quantized, q.t()).mul(amax).mul_(scale / 127.0 if step is None else step)  # [m, out]
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], q.shape[0])
