"""Linear layers whose weights stay in a GGUF file's own block formats (:data:`KERNEL_TYPES`: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, and F16 / BF16 tensors), the weight matrices of the formats
``gguf``, ``gguf-q8`` and ``gguf-q16`` (:data:`BLOCK_FORMATS`), with the interface of
:mod:`chat.models.kernels.matrices`' matrices: ``matrix(x) -> y``, ``matrix.rows(lo, hi)``, ``matrix.fuse_rows``.

::

    weight = BlockWeight("Q4_1", (out, in), raw)   # the file's bytes of one tensor, [out, bytes per row]
    matrix = BlockMatrix(unpack(weight), bias)      # gguf: weight-only; BlockQ8Matrix: gguf-q8
    y = matrix(x)                                   # x float32 [..., in] -> y float32 [..., out]

**One layout for twelve quantized types.** Each type is unpacked (:func:`unpack`) into unsigned quants ``u`` (4 or 8
bits), one float32 scale ``s`` and one offset ``o`` per output channel and sub-block of 16 or 32 inputs, with the
weight ``w = s * u + o``; an offset ``-bias * s`` (a fixed bias) is implied, not stored. ``s * u`` is exact in
float32 for every type (a float16 scale, times a sub-block scale of at most 6 bits in the K-quants and IQ4_XS, times
the quant) and so is ``-bias * s``, or (IQ4_XS, up to 25 bits) ``s * (u - bias)`` is; a fused multiply-add therefore
rounds once, as gguf-py's ``dequantize`` does, and the weights used are the file's own dequantization, bit for bit
(tested per type). How each type maps (bits a weight once packed: quants plus float32 scales and stored offsets;
in the file):

=========  ====================================================================  ======  =======
type       common form                                                           packed  file
=========  ====================================================================  ======  =======
Q4_0       4-bit u, sub 32, bias 8                                               5       4.5
Q4_1       4-bit u, sub 32, stored offsets                                       6       5
Q5_0       8-bit u = q + 112, sub 32, bias 128 (fuses with Q8_0)                 9       5.5
Q5_1       8-bit u, sub 32, stored offsets                                       10      6
Q8_0       8-bit u = q + 128, sub 32, bias 128                                   9       8.5
Q2_K       4-bit u (0..3), sub 16, s = d * scale, o = -dmin * min                8       2.625
Q3_K       4-bit u = q + 4 (0..7), sub 16, s = d * (scale - 32), bias 4          6       3.4375
Q4_K       4-bit u, sub 32, s = d * scale, o = -dmin * min                       6       4.5
Q5_K       8-bit u, sub 32, s = d * scale, o = -dmin * min                       10      5.5
Q6_K       8-bit u, sub 16, s = d * scale, bias 32                               10      6.5625
IQ4_NL     8-bit u = table value + 128, sub 32, bias 128                         9       4.5
IQ4_XS     8-bit u = table value + 128, sub 32, s = d * (scale - 32), bias 128   9       4.25
F16, BF16  kept as 16-bit floats (widened exactly in registers), weight-only      16      16
=========  ====================================================================  ======  =======

The native kernels (``blocks.c``) read that layout repacked for AVX-512 (16 output channels per vector). See
``blocks.c`` for the three designs: weight-only (``gguf``: float32 activations times the exact weights),
activations quantized per 32-block to int8 with VNNI dot products (``gguf-q8``, llama.cpp's design), and to int16
with 16-bit VNNI dot products (``gguf-q16``: the weights exact, the activations' rounding 256 times finer). F16 and
BF16 tensors run weight-only in all three formats (float32 activations: nothing to gain from rounding them).

**Why our own kernels.** llama.cpp's (ggml) run on its own thread pool and graph API, not callable per layer from
torch without a second threading runtime in the process; torch has no kernel for these formats (its int4 CPU kernel
takes neither 8-bit nor 6-bit blocks nor per-32 offsets of this kind) and torchao is not installed. The kernels are a
few hundred lines with the same build, fallback and exactness rules as ``native.c``.

**Without the native kernels** (``TURNCACHE_NATIVE=0``, no compiler, a CPU without AVX-512 VNNI) a matrix keeps its
weights dequantized in float32 (4 bytes a weight) and multiplies with torch: ``gguf`` with ``F.linear``, ``gguf-q8``
(and ``gguf-q16``) after rounding the activations to the same block grid; the same function, up to float summation
order.

A fused group (q/k/v, gate/up) is one matrix when its parts share a layout (:func:`concat`), else a
:class:`StackedMatrix` of one matrix per layout. A layer whose tensor type has no kernel (:data:`KERNEL_TYPES`) is
dequantized to float32 by the loader (:mod:`chat.models.hf.gguf_model`, which warns naming the type).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from chat.models.kernels import native
from chat.models.kernels.dense_matrices import Float32Matrix

BLOCK_FORMATS = ("gguf", "gguf-q8", "gguf-q16")  # served from a GGUF file's blocks: weight-only, int8 / int16
# activations
HALF_TYPES = ("F16", "BF16")  # 16-bit floats, kept in 16 bits (computed weight-only in every block format)
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
KERNEL_TYPES = (*QUANT_TYPES, *HALF_TYPES)  # ggml tensor types kept in blocks (others: dequantized, warned)
SOURCE = Path(__file__).with_name("blocks.c")
ABI_VERSION = 3
CHANNELS = 16  # output channels per packed block (a part of a fused matrix computes alone if it starts on one)
BLOCK = 32  # inputs per tile (activations are quantized per this many in gguf-q8)

_i64, _ptr, _int, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float


# ==================================================================== the file's blocks


@dataclass(frozen=True, slots=True)
class BlockWeight:
    """One weight matrix as a GGUF file stores it."""

    qtype: str  # gguf.GGMLQuantizationType name, one of KERNEL_TYPES
    shape: tuple[int, int]  # (out, in): rows are output channels
    raw: np.ndarray  # uint8 [out, bytes per row]: the file's blocks, rows in the model's order


@dataclass(slots=True)
class Unpacked:
    """A block weight in the common form ``w[c, p] = scale[c, p // sub] * u[c, p] + offset[c, p // sub]``."""

    u: np.ndarray  # uint8 [out, in]: the quants, 0..15 (bits 4) or 0..255 (bits 8)
    scale: np.ndarray  # float32 [out, in // sub]
    offset: np.ndarray | None  # float32 [out, in // sub], or None: -bias * scale
    bits: int  # 4 or 8: how u is stored
    sub: int  # inputs per scale: 16 or 32
    bias: float  # the implied offset's bias when offset is None

    @property
    def shape(self) -> tuple[int, int]:
        return self.u.shape  # type: ignore[return-value]

    def offsets(self) -> np.ndarray:
        """The offsets, stored or implied (exact: the bias is a power of two)."""
        return self.offset if self.offset is not None else (self.scale * np.float32(-self.bias)).astype(np.float32)


@dataclass(slots=True)
class Halves:
    """A weight kept in the file's 16-bit floats (F16 or BF16): every value exact in float32."""

    values: np.ndarray  # uint16 [out, in]: the bit patterns
    kind: str  # "F16" or "BF16"

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape  # type: ignore[return-value]


def warn_float32_layers(log: logging.Logger, path: object, counts: dict[str, int]) -> None:
    """Say on ``log``, per tensor type without a block kernel, how many linear weights of the file ``path`` run
    dequantized in float32 (``counts``: type -> weights)."""
    for qtype, count in sorted(counts.items()):
        log.warning(
            "%s: %d linear weights in %s, which has no block kernel, run dequantized in float32 (kernels: %s)",
            path,
            count,
            qtype,
            ", ".join(KERNEL_TYPES),
        )


def unpack(weight: BlockWeight) -> Unpacked | Halves:
    """``weight`` in the common form (see :class:`Unpacked`), or as :class:`Halves` (F16, BF16).

    Raises:
        ValueError: a type without a kernel, or raw bytes that are not ``shape``'s rows of whole blocks.
    """
    import gguf

    if weight.qtype not in KERNEL_TYPES:
        raise ValueError(f"no block kernel for {weight.qtype}")
    qtype = gguf.GGMLQuantizationType[weight.qtype]
    n, k = weight.shape
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if k % per_block or weight.raw.shape != (n, k // per_block * block_bytes):
        raise ValueError(f"{weight.qtype} weight of shape {weight.shape} has raw bytes of shape {weight.raw.shape}")
    if weight.qtype in HALF_TYPES:
        return Halves(np.ascontiguousarray(weight.raw).view(np.uint16).reshape(n, k), weight.qtype)
    blocks = np.ascontiguousarray(weight.raw).reshape(n, k // per_block, block_bytes)
    return _UNPACK[weight.qtype](blocks, n, k)


def _halves(d: np.ndarray) -> np.ndarray:
    """float16 bytes [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(d).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] quants: the low nibbles, then the high ones (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    u = _nibbles(blocks[..., 2:]).reshape(n, k)
    return Unpacked(u, _halves(blocks[..., 0:2]), None, bits=4, sub=32, bias=8.0)


def _q4_1(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    u = _nibbles(blocks[..., 4:]).reshape(n, k)
    return Unpacked(u, _halves(blocks[..., 0:2]), _halves(blocks[..., 2:4]), bits=4, sub=32, bias=0.0)


def _q8_0(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    u = (np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, k)
    return Unpacked(u, _halves(blocks[..., 0:2]), None, bits=8, sub=32, bias=128.0)


def _q4_k(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """256 inputs a super-block: d, dmin (float16), 8 six-bit scales and mins packed in 12 bytes, 128 bytes of
    nibbles (each 32 bytes: sub-block 2i in the low nibbles, 2i + 1 in the high ones)."""
    d, dmin = _halves(blocks[..., 0:2])[..., None], _halves(blocks[..., 2:4])[..., None]
    scales, mins = _k_scales(blocks[..., 4:16], n)
    qs = blocks[..., 16:].reshape(n, -1, 4, 1, 32)
    u = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(n, k)
    return Unpacked(u, (d * scales).reshape(n, -1), (-(dmin * mins)).reshape(n, -1), bits=4, sub=32, bias=0.0)


def _q6_k(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """256 inputs a super-block: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 sub-block scales,
    d (float16); w = d * scale * (q - 32)."""
    ql = blocks[..., :128].reshape(n, -1, 2, 1, 64)
    ql = np.concatenate([ql & 0x0F, ql >> 4], axis=-2).reshape(n, -1, 8, 32)
    qh = blocks[..., 128:192].reshape(n, -1, 2, 1, 32)
    qh = np.concatenate([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], axis=-2).reshape(n, -1, 8, 32)
    u = (ql | (qh << 4)).reshape(n, k)
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)
    d = _halves(blocks[..., 208:210])[..., None]
    return Unpacked(u, (d * scales).reshape(n, -1), None, bits=8, sub=16, bias=32.0)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[..., 4] bytes (a little-endian uint32) -> [..., 32] bits, bit i of the word at i."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")


def _q5_0(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """32 inputs a block: d (float16), 32 high bits, 16 bytes of nibbles; w = d * (q - 16), stored as Q8_0's
    unsigned quants (u = q + 112, bias 128) so that a Q5_0 matrix fuses with a Q8_0 or IQ4 one."""
    u = (_nibbles(blocks[..., 6:]) | (_high_bits(blocks[..., 2:6]) << 4)) + np.uint8(112)
    return Unpacked(u.reshape(n, k), _halves(blocks[..., 0:2]), None, bits=8, sub=32, bias=128.0)


def _q5_1(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """32 inputs a block: d, m (float16), 32 high bits, 16 bytes of nibbles; w = d * q + m."""
    u = _nibbles(blocks[..., 8:]) | (_high_bits(blocks[..., 4:8]) << 4)
    return Unpacked(u.reshape(n, k), _halves(blocks[..., 0:2]), _halves(blocks[..., 2:4]), bits=8, sub=32, bias=0.0)


def _k_scales(packed: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 8 six-bit scales and mins packed in 12 bytes -> float32 [n, blocks, 8] each."""
    packed = packed.reshape(n, -1, 3, 4)
    low, high, both = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
    scales = np.concatenate([low & 0x3F, (both & 0x0F) | ((low >> 2) & 0x30)], axis=-1).astype(np.float32)
    mins = np.concatenate([high & 0x3F, (both >> 4) | ((high >> 2) & 0x30)], axis=-1).astype(np.float32)
    return scales, mins


def _q5_k(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """256 inputs a super-block: d, dmin (float16), 8 six-bit scales and mins in 12 bytes, 32 bytes of high bits
    (bit i of byte p: input p of sub-block i), 128 bytes of nibbles (as Q4_K); w = d * scale * q - dmin * min."""
    d, dmin = _halves(blocks[..., 0:2])[..., None], _halves(blocks[..., 2:4])[..., None]
    scales, mins = _k_scales(blocks[..., 4:16], n)
    qs = blocks[..., 48:].reshape(n, -1, 4, 1, 32)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(n, -1, 8, 32)
    high = (blocks[..., 16:48].reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    u = (low | (high << 4)).reshape(n, k)
    return Unpacked(u, (d * scales).reshape(n, -1), (-(dmin * mins)).reshape(n, -1), bits=8, sub=32, bias=0.0)


def _q3_k(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """256 inputs a super-block: 32 bytes of high bits, 64 bytes of 2-bit quants, 16 six-bit scales in 12 bytes,
    d (float16); w = d * (scale - 32) * q, q = low - 4 * (1 - high) in -4..3, stored as u = low + 4 * high with the
    implied offset -4 * s (Q6_K's form, 4-bit quants)."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
    low = (blocks[..., 32:96].reshape(n, -1, 2, 1, 32) >> shifts) & 3  # [n, b, 2, 4, 32]
    high = (blocks[..., 0:32].reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    u = (low.reshape(n, -1, 256) | (high.reshape(n, -1, 256) << 2)).reshape(n, k)
    packed = blocks[..., 96:108]
    lscales = np.concatenate([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], axis=-1)
    hscales = ((packed[..., 8:12, None] >> shifts.reshape(1, 4)) & 3).transpose(0, 1, 3, 2).reshape(n, -1, 16)
    scales = (lscales | (hscales << 4)).astype(np.float32) - 32.0
    d = _halves(blocks[..., 108:110])[..., None]
    return Unpacked(u, (d * scales).reshape(n, -1), None, bits=4, sub=16, bias=4.0)


def _q2_k(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """256 inputs a super-block: 16 bytes of 4-bit scales and mins, 64 bytes of 2-bit quants, d, dmin (float16);
    w = d * scale * q - dmin * min per sub-block of 16."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
    u = ((blocks[..., 16:80].reshape(n, -1, 2, 1, 32) >> shifts) & 3).reshape(n, k)
    sc = blocks[..., 0:16]
    d, dmin = _halves(blocks[..., 80:82])[..., None], _halves(blocks[..., 82:84])[..., None]
    scale = (d * (sc & 0x0F).astype(np.float32)).reshape(n, -1)
    offset = (-(dmin * (sc >> 4).astype(np.float32))).reshape(n, -1)
    return Unpacked(u, scale, offset, bits=4, sub=16, bias=0.0)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int16)
_IQ4_U = (IQ4_VALUES + 128).astype(np.uint8)  # the non-linear 4-bit table as unsigned quants (bias 128)


def _iq4_nl(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """32 inputs a block: d (float16), 16 bytes of nibbles indexing a fixed table of int8 values; w = d * value."""
    u = _IQ4_U[_nibbles(blocks[..., 2:])].reshape(n, k)
    return Unpacked(u, _halves(blocks[..., 0:2]), None, bits=8, sub=32, bias=128.0)


def _iq4_xs(blocks: np.ndarray, n: int, k: int) -> Unpacked:
    """256 inputs a super-block: d (float16), 6-bit sub-block scales (2 high bits each in a uint16, 4 low bits in
    4 bytes), 128 bytes of nibbles (16 a sub-block of 32, as IQ4_NL); w = d * (scale - 32) * value."""
    d = _halves(blocks[..., 0:2])[..., None]
    high = np.ascontiguousarray(blocks[..., 2:4]).view(np.uint16)  # [n, b, 1]
    high = ((high >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)  # [n, b, 8]
    low = blocks[..., 4:8]
    low = np.stack([low & 0x0F, low >> 4], axis=-1).reshape(n, -1, 8)
    scales = (low | (high << 4)).astype(np.float32) - 32.0
    u = _IQ4_U[_nibbles(blocks[..., 8:].reshape(n, -1, 8, 16))].reshape(n, k)
    return Unpacked(u, (d * scales).reshape(n, -1), None, bits=8, sub=32, bias=128.0)


_UNPACK = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
}


def dequantize(p: Unpacked | Halves) -> torch.Tensor:
    """float32 ``[out, in]``: ``scale * u + offset`` rounded once, or the 16-bit floats widened (the file's
    dequantization, bit for bit)."""
    if isinstance(p, Halves):
        return torch.from_numpy(_widen(p.values, p.kind))
    s = np.repeat(p.scale.astype(np.float64), p.sub, axis=1)
    o = np.repeat(p.offsets().astype(np.float64), p.sub, axis=1)
    return torch.from_numpy((s * p.u + o).astype(np.float32))


def _widen(values: np.ndarray, kind: str) -> np.ndarray:
    """uint16 bit patterns of F16 or BF16 -> float32 (exact)."""
    if kind == "F16":
        return values.view(np.float16).astype(np.float32)
    return (values.astype(np.uint32) << 16).view(np.float32)


def concat(parts: list[Any]) -> Unpacked | Halves | None:
    """The parts' output channels in one matrix, or None when their layouts differ (quant widths, sub-blocks, or
    16-bit kinds)."""
    first = parts[0]
    if isinstance(first, Halves) or any(isinstance(p, Halves) for p in parts):
        if all(isinstance(p, Halves) and p.kind == first.kind for p in parts):
            return Halves(np.concatenate([p.values for p in parts]), first.kind)
        return None
    if any(p.bits != first.bits or p.sub != first.sub for p in parts):
        return None
    implied = all(p.offset is None and p.bias == first.bias for p in parts)
    return Unpacked(
        np.concatenate([p.u for p in parts]),
        np.concatenate([p.scale for p in parts]),
        None if implied else np.concatenate([p.offsets() for p in parts]),
        bits=first.bits,
        sub=first.sub,
        bias=first.bias if implied else 0.0,
    )


def pack(p: Unpacked | Halves) -> np.ndarray:
    """The flat uint8 layout ``blocks.c`` reads (see its header): channel blocks of 16 (the last padded with zero
    weights), each a sequence of tiles of 32 inputs holding quants, scales and stored offsets; for 16-bit floats,
    each input's 16 channel values in a row."""
    n, k = p.shape
    blocks = -(-n // CHANNELS)
    pad = blocks * CHANNELS - n
    if isinstance(p, Halves):  # [block][input][channel] uint16
        v = np.pad(p.values, ((0, pad), (0, 0))).reshape(blocks, CHANNELS, k).transpose(0, 2, 1)
        return np.ascontiguousarray(v).reshape(-1).view(np.uint8)
    nj, ns = k // BLOCK, BLOCK // p.sub
    u = np.pad(p.u, ((0, pad), (0, 0)))
    if p.bits == 4:  # byte [g][c][e] = u[c][8g + e] | u[c][8g + 4 + e] << 4
        q = u.reshape(blocks, CHANNELS, nj, 4, 2, 4)
        q = (q[..., 0, :] | (q[..., 1, :] << 4)).transpose(0, 2, 3, 1, 4).reshape(blocks, nj, 256)
    else:  # byte [g][c][e] = u[c][4g + e]
        q = u.reshape(blocks, CHANNELS, nj, 8, 4).transpose(0, 2, 3, 1, 4).reshape(blocks, nj, 512)

    def vectors(values: np.ndarray) -> np.ndarray:  # [n, in // sub] -> per tile, ns vectors of 16 channels
        v = np.pad(values.astype(np.float32), ((0, pad), (0, 0))).reshape(blocks, CHANNELS, nj, ns)
        return np.ascontiguousarray(v.transpose(0, 2, 3, 1)).reshape(blocks, nj, ns * CHANNELS).view(np.uint8)

    parts = [np.ascontiguousarray(q), vectors(p.scale)]
    if p.offset is not None:
        parts.append(vectors(p.offset))
    return np.ascontiguousarray(np.concatenate(parts, axis=2).reshape(-1))


def block_bytes(p: Unpacked | Halves) -> int:
    """Bytes of one packed channel block (16 output channels, all inputs)."""
    k = p.shape[1]
    if isinstance(p, Halves):
        return 2 * CHANNELS * k
    return k // BLOCK * (p.bits * 64 + (BLOCK // p.sub) * 64 * (1 if p.offset is None else 2))


# ==================================================================== the kernels


class Kernels:
    """The loaded ``blocks.c``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._linear = lib.tc_blocks_linear
        self._linear.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _int, _int, _int, _f32, _int, _ptr, _ptr, _i64]
        self._linear.restype = ctypes.c_int
        self._half = lib.tc_blocks_half_linear
        self._half.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _int, _ptr, _ptr, _i64]
        self._half.restype = ctypes.c_int

    def linear(self, rows: torch.Tensor, matrix: BlockMatrix) -> torch.Tensor:
        """``[m, out]`` float32 for ``rows`` float32 ``[m, in]`` (last dim contiguous) through ``matrix``'s packed
        weights."""
        m, k = rows.shape
        out = torch.empty((m, matrix.out_features), dtype=torch.float32)
        weights = matrix.packed.ctypes.data + matrix.start
        bias = None if matrix.bias is None else matrix.bias.data_ptr()
        if matrix.bits == 16:
            status = self._half(
                m, k, matrix.out_features, rows.data_ptr(), rows.stride(0), weights, int(matrix.bf16), bias,
                out.data_ptr(), matrix.out_features,
            )  # fmt: skip
        else:
            status = self._linear(
                m, k, matrix.out_features, rows.data_ptr(), rows.stride(0), weights, matrix.bits, BLOCK // matrix.sub,
                int(matrix.stored_offsets), matrix.bias_value, matrix.mode, bias, out.data_ptr(), matrix.out_features,
            )  # fmt: skip
        if status:
            raise native.NativeError("tc_blocks_linear could not allocate scratch memory")
        return out


_lock = threading.Lock()
_loaded: list[Kernels | None] = []


def kernels() -> Kernels | None:
    """The block kernels, built and loaded on first use; None where the native kernels are off (same rules)."""
    if native.kernels() is None:
        return None
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def _load() -> Kernels | None:
    lib = native.build_library(SOURCE)
    if lib is None or lib.tc_blocks_abi_version() != ABI_VERSION or not lib.tc_blocks_supported():
        return None
    return Kernels(lib)


# ==================================================================== matrices


class BlockMatrix:
    """A weight matrix in its file's blocks, computed weight-only: float32 activations times the exact weights
    (format ``gguf``). 16-bit float weights (F16, BF16) are computed this way in every block format."""

    fuse_rows = 1 << 30  # a fused group always computes all its parts at once (one pass, one call)
    mode = 0  # blocks.c's design: activations stay float32
    levels = 0  # activations rounded to this many steps a side per 32-block (0: not rounded)

    def __init__(self, weight: Unpacked | Halves, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        halves = isinstance(weight, Halves)
        self.bits = 16 if halves else weight.bits  # the packed layout (see blocks.c); 16: 16-bit floats
        self.sub = BLOCK if halves else weight.sub
        self.bf16 = halves and weight.kind == "BF16"
        self.stored_offsets = not halves and weight.offset is not None
        self.bias_value = 0.0 if halves else weight.bias  # the implied offsets' bias
        if halves:
            self.mode, self.levels = 0, 0  # weight-only whatever the format
        self.bias = None if bias is None else bias.detach().float().contiguous()  # [out]
        self.kernels = kernels()
        self.packed: np.ndarray | None = None  # blocks.c's layout (with the kernels)
        self.start = 0  # byte where this matrix's first channel block starts in packed
        self.block_bytes = 0  # bytes of one packed channel block
        self.dense: torch.Tensor | None = None  # float32 [out, in] (without them)
        self.columns: tuple[int, int] | None = None  # a part that computes its whole group: its outputs in there
        if self.kernels is not None:
            self.packed = pack(weight)
            self.block_bytes = block_bytes(weight)
        else:
            self.dense = dequantize(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if rows.stride(-1) != 1 or rows.dtype != torch.float32:
            rows = rows.float().contiguous()
        if self.kernels is None:
            assert self.dense is not None
            out = F.linear(quantize_activations(rows, self.levels) if self.levels else rows, self.dense, self.bias)
        else:
            out = self.kernels.linear(rows, self)
        if self.columns is not None:
            out = out[:, self.columns[0] : self.columns[1]].contiguous()
        return out.view(*x.shape[:-1], out.shape[-1])

    def rows(self, lo: int, hi: int) -> BlockMatrix:
        """Output channels ``[lo, hi)`` as a matrix of their own, sharing this one's memory."""
        part = type(self).__new__(type(self))
        names = ("in_features", "bits", "sub", "bf16", "stored_offsets", "bias_value", "mode", "levels", "kernels")
        for name in (*names, "packed", "block_bytes"):
            setattr(part, name, getattr(self, name))
        part.out_features, part.start, part.columns = hi - lo, self.start, None
        part.bias = None if self.bias is None else self.bias[lo:hi]
        part.dense = None if self.dense is None else self.dense[lo:hi]
        if self.packed is not None:
            if lo % CHANNELS == 0:  # its packed blocks start where its channels do
                part.start = self.start + lo // CHANNELS * self.block_bytes
            else:  # computes its whole group and keeps its columns (only when called apart from its group)
                part.out_features, part.bias, part.columns = self.out_features, self.bias, (lo, hi)
        return part

    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 ``[len(rows), in]``: the weights of output channels ``rows``, read back from the packed layout
        (``s * u + o`` rounded once, as :func:`dequantize`: the file's values, bit for bit). Needs the packed
        layout of a whole matrix (a matrix, not a part of one)."""
        assert self.packed is not None and self.start == 0 and self.columns is None
        k, count = self.in_features, len(rows)
        block, lane, pick = rows // CHANNELS, rows % CHANNELS, np.arange(count)
        if self.bits == 16:
            values = self.packed.view(np.uint16).reshape(-1, k, CHANNELS)[block, :, lane]  # [count, k]
            return _widen(np.ascontiguousarray(values), "BF16" if self.bf16 else "F16")
        nj, ns = k // BLOCK, BLOCK // self.sub
        tiles = self.packed.reshape(-1, nj, self.block_bytes // nj)[block]  # [count, nj, tile]
        quant = self.bits * 64
        if self.bits == 4:  # byte [g][c][e] = u[8g + e] | u[8g + 4 + e] << 4
            q = tiles[:, :, :quant].reshape(count, nj, 4, CHANNELS, 4)[pick, :, :, lane, :]  # [count, nj, 4, 4]
            u = np.stack([q & 0x0F, q >> 4], axis=3).reshape(count, k)
        else:  # byte [g][c][e] = u[4g + e]
            u = tiles[:, :, :quant].reshape(count, nj, 8, CHANNELS, 4)[pick, :, :, lane, :].reshape(count, k)

        def vectors(at: int) -> np.ndarray:  # [count, k]: channel `lane`'s value of each sub-block, repeated
            v = np.ascontiguousarray(tiles[:, :, at : at + ns * 64]).view(np.float32).reshape(count, nj, ns, CHANNELS)
            return np.repeat(v[pick, :, :, lane].reshape(count, nj * ns).astype(np.float64), self.sub, axis=1)

        scale = vectors(quant)
        offset = vectors(quant + ns * 64) if self.stored_offsets else scale * -self.bias_value
        return (scale * u + offset).astype(np.float32)

    def weight_bytes(self) -> int:
        """Bytes this matrix's weights take in memory (packed, or dense float32 without the kernels)."""
        if self.packed is not None:
            return int(self.packed.nbytes)
        return 0 if self.dense is None else self.dense.numel() * 4


class BlockQ8Matrix(BlockMatrix):
    """A weight matrix in its file's blocks, with the activations quantized per 32-block to int8 and integer dot
    products (format ``gguf-q8``)."""

    mode, levels = 1, 127


class BlockQ16Matrix(BlockMatrix):
    """A weight matrix in its file's blocks, with the activations quantized per 32-block to int16 and 16-bit
    integer dot products (format ``gguf-q16``)."""

    mode, levels = 2, 32767


def quantize_activations(rows: torch.Tensor, levels: int = 127) -> torch.Tensor:
    """``rows`` [m, in] rounded to their integer grid per 32-block (scale max|x| / levels, nearest even), as float32:
    what the ``gguf-q8`` (127) and ``gguf-q16`` (32767) kernels multiply (the torch path's stand-in)."""
    m, k = rows.shape
    blocks = rows.reshape(m, k // BLOCK, BLOCK)
    step = blocks.abs().amax(dim=-1, keepdim=True) / float(levels)
    safe = torch.where(step > 0, step, torch.ones_like(step))
    return (torch.round(blocks / safe) * step).reshape(m, k)


class StackedMatrix:
    """Parts of a fused group whose layouts differ (e.g. Q4_K q/k beside a Q6_K v): each computed by its own matrix,
    the outputs side by side."""

    fuse_rows = 1 << 30

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts  # matrices, in output order
        self.bounds = []  # part i's outputs: columns [lo, hi)
        lo = 0
        for p in parts:
            width = p.out_features if isinstance(p, BlockMatrix) else p.weight.shape[0]
            self.bounds.append((lo, lo + width))
            lo += width
        self.out_features = lo

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def rows(self, lo: int, hi: int) -> Any:
        for part, bounds in zip(self.parts, self.bounds, strict=True):
            if bounds == (lo, hi):
                return part
        raise ValueError(f"rows [{lo}, {hi}) are not one part of this stacked matrix ({self.bounds})")


def float32_layers(model: torch.nn.Module) -> int:
    """Linear layers of a loaded model (its modules' matrices: the own decoder's or the fast paths') that a block
    format computes from float32 weights: a tensor type without a kernel, a float32 tensor, or an architecture
    dequantized whole. 0 when every linear layer keeps its file's blocks."""
    seen: set[int] = set()

    def count(obj: Any) -> int:
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        if isinstance(obj, Float32Matrix):
            return 1
        if isinstance(obj, StackedMatrix):
            return sum(count(part) for part in obj.parts)
        if not isinstance(obj, BlockMatrix) and hasattr(obj, "matrix") and hasattr(obj, "bounds"):  # a fused group
            return count(obj.matrix)
        return 0

    return sum(count(value) for module in model.modules() for value in vars(module).values())


class BlockEmbedding(torch.nn.Module):
    """An embedding table kept in its file's blocks: a lookup dequantizes the rows asked for, so every value is the
    file's own dequantization, as a float32 table would hold it, at 4.25-9 bits a value instead of 32. The rows come
    from a tied LM head's packed matrix (no memory of its own) or from a copy of the file's blocks (any type gguf-py
    dequantizes). ``embed(ids)`` -> float32 ``[*ids.shape, dim]``."""

    def __init__(self, source: BlockWeight | BlockMatrix) -> None:
        super().__init__()
        self.head = source if isinstance(source, BlockMatrix) else None  # the tied head whose packed rows it reads
        self.qtype = "" if self.head is not None else source.qtype  # else: the file's type (any gguf-py reads)
        self.raw = None if self.head is not None else np.array(source.raw, copy=True)  # uint8 [vocab, bytes a row]
        if isinstance(source, BlockMatrix):
            self.num_embeddings, self.embedding_dim = source.out_features, source.in_features
        else:
            self.num_embeddings, self.embedding_dim = source.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu().numpy()
        if self.head is not None:
            values = self.head.dequantize_rows(flat)
        else:
            import gguf

            assert self.raw is not None
            values = gguf.quants.dequantize(self.raw[flat], gguf.GGMLQuantizationType[self.qtype])
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        where = "the head's packed blocks" if self.head is not None else f"{self.qtype} blocks"
        return f"{self.num_embeddings}, {self.embedding_dim}, {where}"


# ==================================================================== what a forward builds matrices with


class BlockFormat:
    """A weight format of :data:`BLOCK_FORMATS` as the forwards use it (:func:`chat.models.decoder.model.build_decoder`,
    :func:`chat.models.hf.fast_paths.install`: ``chat.models.kernels.matrices.MATRICES``): a matrix from
    the linear layers of a fused group (or one layer). A layer the loader marked with ``block_weight`` (a
    :class:`BlockWeight`) is computed from its blocks; any other (dequantized: a type without a kernel) in float32."""

    def __init__(self, matrix: type[BlockMatrix]) -> None:
        self.matrix = matrix  # BlockMatrix, BlockQ8Matrix or BlockQ16Matrix

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        return Float32Matrix(weight, bias)

    def from_layers(self, layers: list[Any]) -> Any:
        blocks = [getattr(layer, "block_weight", None) for layer in layers]
        biases = [layer.bias for layer in layers]
        bias = None if biases[0] is None else torch.cat([b.detach().float() for b in biases])
        if all(b is not None for b in blocks):
            merged = concat([unpack(b) for b in blocks])
            if merged is not None:
                return self.matrix(merged, bias)
        if len(layers) == 1:
            return self(layers[0].weight, layers[0].bias)
        return StackedMatrix([self.from_layers([layer]) for layer in layers])


MATRICES = {
    "gguf": BlockFormat(BlockMatrix),
    "gguf-q8": BlockFormat(BlockQ8Matrix),
    "gguf-q16": BlockFormat(BlockQ16Matrix),
}
