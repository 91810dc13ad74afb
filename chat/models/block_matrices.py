"""Linear layers whose weights stay in a GGUF file's own block formats (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), the weight
matrices of the formats ``gguf``, ``gguf-q8`` and ``gguf-q16`` (:data:`BLOCK_FORMATS`), with the interface of
:mod:`chat.models.matrices`' matrices: ``matrix(x) -> y``, ``matrix.rows(lo, hi)``, ``matrix.fuse_rows``.

::

    weight = BlockWeight("Q4_1", (out, in), raw)   # the file's bytes of one tensor, [out, bytes per row]
    matrix = BlockMatrix(unpack(weight), bias)      # gguf: weight-only; BlockQ8Matrix: gguf-q8
    y = matrix(x)                                   # x float32 [..., in] -> y float32 [..., out]

**One layout for five formats.** Each format is unpacked (:func:`unpack`) into unsigned quants ``u`` (4 or 8 bits),
one float32 scale ``s`` and one offset ``o`` per output channel and sub-block of 16 or 32 inputs, with the weight
``w = s * u + o``; the offset of Q4_0, Q8_0 and Q6_K is ``-bias * s`` (bias 8, 128, 32) and is not stored. ``s * u``
is exact in float32 for every format (at most 24 significant bits: a float16 scale, times a 6-bit sub-block scale in
the K-quants, times the quant), and so is ``-bias * s``; a fused multiply-add therefore rounds once, as gguf-py's
``dequantize`` does, and the weights used are the file's own dequantization, bit for bit (tested).
The native kernels (``blocks.c``) read that layout repacked for AVX-512 (16 output channels per vector); it costs 5
bits a weight for Q4_0, 6 for Q4_1 / Q4_K (4.5-5 in the file: float32 scales, offsets), 9 for Q8_0 and 10 for Q6_K
(8-bit quants). See ``blocks.c`` for the three designs: weight-only (``gguf``: float32 activations times the exact
weights), activations quantized per 32-block to int8 with VNNI dot products (``gguf-q8``, llama.cpp's design), and
to int16 with 16-bit VNNI dot products (``gguf-q16``: the weights exact, the activations' rounding 256 times finer).

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
dequantized to float32 by the loader (:mod:`chat.models.gguf_model`, which warns naming the type).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from chat.models import native

BLOCK_FORMATS = ("gguf", "gguf-q8", "gguf-q16")  # served from a GGUF file's blocks: weight-only, int8 / int16
# activations
KERNEL_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")  # ggml tensor types kept in blocks (others: dequantized)
SOURCE = Path(__file__).with_name("blocks.c")
ABI_VERSION = 2
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


def unpack(weight: BlockWeight) -> Unpacked:
    """``weight`` in the common form (see :class:`Unpacked`).

    Raises:
        ValueError: a type without a kernel, or raw bytes that are not ``shape``'s rows of whole blocks.
    """
    import gguf

    qtype = gguf.GGMLQuantizationType[weight.qtype]
    if weight.qtype not in KERNEL_TYPES:
        raise ValueError(f"no block kernel for {weight.qtype}")
    n, k = weight.shape
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if k % per_block or weight.raw.shape != (n, k // per_block * block_bytes):
        raise ValueError(f"{weight.qtype} weight of shape {weight.shape} has raw bytes of shape {weight.raw.shape}")
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
    packed = blocks[..., 4:16].reshape(n, -1, 3, 4)
    low, high, both = packed[..., 0, :], packed[..., 1, :], packed[..., 2, :]
    scales = np.concatenate([low & 0x3F, (both & 0x0F) | ((low >> 2) & 0x30)], axis=-1).astype(np.float32)
    mins = np.concatenate([high & 0x3F, (both >> 4) | ((high >> 2) & 0x30)], axis=-1).astype(np.float32)
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


_UNPACK = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def dequantize(p: Unpacked) -> torch.Tensor:
    """float32 ``[out, in]``: ``scale * u + offset`` rounded once (the file's dequantization, bit for bit)."""
    s = np.repeat(p.scale.astype(np.float64), p.sub, axis=1)
    o = np.repeat(p.offsets().astype(np.float64), p.sub, axis=1)
    return torch.from_numpy((s * p.u + o).astype(np.float32))


def concat(parts: list[Unpacked]) -> Unpacked | None:
    """The parts' output channels in one matrix, or None when their quant widths or sub-blocks differ."""
    first = parts[0]
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


def pack(p: Unpacked) -> np.ndarray:
    """The flat uint8 layout ``blocks.c`` reads (see its header): channel blocks of 16 (the last padded with zero
    weights), each a sequence of tiles of 32 inputs holding quants, scales and stored offsets."""
    n, k = p.shape
    blocks, nj, ns = -(-n // CHANNELS), k // BLOCK, BLOCK // p.sub
    pad = blocks * CHANNELS - n
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


def tile_bytes(p: Unpacked) -> int:
    """Bytes of one packed tile (16 channels x 32 inputs)."""
    return p.bits * 64 + (BLOCK // p.sub) * 64 * (1 if p.offset is None else 2)


# ==================================================================== the kernels


class Kernels:
    """The loaded ``blocks.c``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._linear = lib.tc_blocks_linear
        self._linear.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _int, _int, _int, _f32, _int, _ptr, _ptr, _i64]
        self._linear.restype = ctypes.c_int

    def linear(self, rows: torch.Tensor, matrix: BlockMatrix) -> torch.Tensor:
        """``[m, out]`` float32 for ``rows`` float32 ``[m, in]`` (last dim contiguous) through ``matrix``'s packed
        weights."""
        m, k = rows.shape
        out = torch.empty((m, matrix.out_features), dtype=torch.float32)
        status = self._linear(
            m,
            k,
            matrix.out_features,
            rows.data_ptr(),
            rows.stride(0),
            matrix.packed.ctypes.data + matrix.start,
            matrix.bits,
            BLOCK // matrix.sub,
            int(matrix.stored_offsets),
            matrix.bias_value,
            matrix.mode,
            None if matrix.bias is None else matrix.bias.data_ptr(),
            out.data_ptr(),
            matrix.out_features,
        )
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
    (format ``gguf``)."""

    fuse_rows = 1 << 30  # a fused group always computes all its parts at once (one pass, one call)
    mode = 0  # blocks.c's design: activations stay float32
    levels = 0  # activations rounded to this many steps a side per 32-block (0: not rounded)

    def __init__(self, weight: Unpacked, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.bits, self.sub = weight.bits, weight.sub  # the packed layout (see blocks.c)
        self.stored_offsets = weight.offset is not None
        self.bias_value = weight.bias  # the implied offsets' bias
        self.bias = None if bias is None else bias.detach().float().contiguous()  # [out]
        self.kernels = kernels()
        self.packed: np.ndarray | None = None  # blocks.c's layout (with the kernels)
        self.start = 0  # byte where this matrix's first channel block starts in packed
        self.dense: torch.Tensor | None = None  # float32 [out, in] (without them)
        self.columns: tuple[int, int] | None = None  # a part that computes its whole group: its outputs in there
        if self.kernels is not None:
            self.packed = pack(weight)
            self.tile = tile_bytes(weight)
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
        for name in ("in_features", "bits", "sub", "stored_offsets", "bias_value", "kernels", "packed", "tile"):
            setattr(part, name, getattr(self, name, None))
        part.out_features, part.start, part.columns = hi - lo, self.start, None
        part.bias = None if self.bias is None else self.bias[lo:hi]
        part.dense = None if self.dense is None else self.dense[lo:hi]
        if self.packed is not None:
            if lo % CHANNELS == 0:  # its packed blocks start where its channels do
                part.start = self.start + lo // CHANNELS * (self.in_features // BLOCK) * self.tile
            else:  # computes its whole group and keeps its columns (only when called apart from its group)
                part.out_features, part.bias, part.columns = self.out_features, self.bias, (lo, hi)
        return part


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


# ==================================================================== what a forward builds matrices with


class BlockFormat:
    """A weight format of :data:`BLOCK_FORMATS` as the forwards use it (:func:`chat.models.decoder.build_decoder`,
    :func:`chat.models.fast_paths.install`: ``chat.models.matrices.MATRICES``): a matrix from
    the linear layers of a fused group (or one layer). A layer the loader marked with ``block_weight`` (a
    :class:`BlockWeight`) is computed from its blocks; any other (dequantized: a type without a kernel) in float32."""

    def __init__(self, matrix: type[BlockMatrix]) -> None:
        self.matrix = matrix  # BlockMatrix, BlockQ8Matrix or BlockQ16Matrix

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        from chat.models.matrices import Float32Matrix

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
