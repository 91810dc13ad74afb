"""turncache's two C kernels (``native.c``), for the two places where torch's own operations cost most per step:

- :meth:`Kernels.int8_linear`: an int8 linear layer. ``torch._int_mm`` takes a fast matrix-vector path for one row
  but repacks the weight on every call for two rows or more, so a batched decode step paid about 3x per weight byte
  what a one-sequence step paid. This kernel keeps the weight packed for AVX-512 VNNI (:meth:`Kernels.pack_int8`),
  reads each weight byte once for up to 8 rows (prefetching ahead of the stream), and gives the numbers of
  ``chat.models.fast_paths.int8_linear`` bit for bit: the integer sums are exact and the float operations are the
  same, in the same order. It was faster than ``torch._int_mm`` at every row count measured (1 to 256).
- :meth:`Kernels.attention`: the attention of every sequence of a packed step over its own K/V rows, in one call per
  layer: decode tokens (whose new K/V it writes into the rows :mod:`chat.models.ragged` reserved) and prefill
  chunks (causal, within the layer's sliding window). Torch's way was ~6 operations per sequence and layer, ~25 us
  each at short contexts, and SDPA's ~110 us per short chunk; for a 256-token chunk over 1,700 rows the kernel
  takes about what SDPA takes (7.0 vs 6.7 ms a layer). Each query token is computed the same way whatever else is
  in the call, so a position's attention does not depend on how its prompt was cut into chunks or batched.

Each output element is computed by one thread in a fixed order, whatever the number of rows or sequences in the
call, so a sequence's result inside a batch equals its result alone (the batched-exactness tests hold either way).

The library is compiled once per machine with the system C compiler (``$CC`` or ``cc``) into
``$TURNCACHE_HOME/native`` (by default ``~/.cache/turncache/native``), under a name that digests the source, the
compiler's version, the flags and the CPU model, and loaded with :mod:`ctypes`. It shares torch's OpenMP runtime
(same soname), so its threads are the calling thread's torch threads. Without a compiler, on a CPU without AVX-512
VNNI, or with ``TURNCACHE_NATIVE=0``, :func:`kernels` returns None and the callers keep their torch paths (logged
once). Which path a model's int8 layers take is fixed when they are built; attention decides at every call.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import hashlib
import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

_log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off")
INT8_CHANNEL_ALIGN = 32  # a packed weight's rows can be sliced at multiples of this many output channels
ABI_VERSION = 6
_TABLE_FIELDS = 12  # columns of an attention table (Kernels.attention)
KV_DTYPES = {torch.float32: 0, torch.float16: 1}  # K/V rows the attention kernel reads -> the table's "half" field

_lock = threading.Lock()
_loaded: list[Kernels | None] = []  # [] until the first call of kernels(); then [the kernels or None]
_enabled = [os.environ.get("TURNCACHE_NATIVE", "1") != "0"]

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class NativeError(RuntimeError):
    """A kernel could not allocate its scratch memory."""


class Kernels:
    """The loaded library's entry points."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._int8 = lib.tc_int8_linear
        self._int8.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _i64]
        self._int8.restype = ctypes.c_int
        self._packed_size = lib.tc_int8_packed_size
        self._packed_size.argtypes = [_i64, _i64]
        self._packed_size.restype = _i64
        self._pack = lib.tc_int8_pack
        self._pack.argtypes = [_i64, _i64, _ptr, _i64, _ptr]
        self._pack.restype = None
        self._attention = lib.tc_attention
        self._attention.argtypes = [_i64] * 5 + [_ptr, _ptr] + [_i64, _f32, _ptr, _i64, _i64]
        self._attention.restype = ctypes.c_int

    def pack_int8(self, q: torch.Tensor) -> torch.Tensor:
        """``q`` (int8 ``[out, in]``, last dim contiguous) in the layout :meth:`int8_linear` reads: channels in
        blocks of 16, inputs in groups of 4 bytes (see ``native.c``); a flat int8 tensor."""
        n, k = q.shape
        packed = torch.empty(self._packed_size(n, k), dtype=torch.int8)
        self._pack(n, k, q.data_ptr(), q.stride(0), packed.data_ptr())
        return packed

    def int8_linear(
        self,
        rows: torch.Tensor,
        packed: torch.Tensor,
        wsum: torch.Tensor,
        step: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """``[m, out]`` float32: what ``fast_paths.int8_linear(rows, q, scale, bias, step=step)`` returns, for
        ``rows`` float32 ``[m, in]`` (last dim contiguous), ``packed`` = :meth:`pack_int8` of ``q``, ``wsum``
        int32 ``[out]`` (``q.sum(1)``), ``step`` and ``bias`` float32 ``[out]`` contiguous."""
        m, k = rows.shape
        n = wsum.shape[0]
        out = torch.empty((m, n), dtype=torch.float32)
        status = self._int8(
            m,
            k,
            n,
            rows.data_ptr(),
            rows.stride(0),
            packed.data_ptr(),
            wsum.data_ptr(),
            step.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            n,
        )
        if status:
            raise NativeError("tc_int8_linear could not allocate scratch memory")
        return out

    def attention(
        self,
        queries: torch.Tensor,
        kv_heads: int,
        table: Sequence[tuple[int, ...]],
        window: int | None,
        new_heads: tuple[int, int],
        out: torch.Tensor,
        softcap: float | None,
    ) -> None:
        """Fill ``out`` ``[T, H, Dv]`` (contiguous float32) with the attention of ``queries`` ``[T, H, D]``
        (contiguous float32, already scaled), one row of ``table`` per sequence (addresses in bytes, strides in
        elements; data whose last dimension is contiguous)::

            (keys, key head stride, key row stride, values, value head stride, value row stride, rows,
             new key, new value, query tokens, first query token, half)

        ``keys`` / ``values``: the sequence's first visible row of K/V head 0: float32 rows, or float16 rows when
        ``half`` is 1 (read into float32). Its query tokens are its last positions, tokens ``first .. first + query
        tokens - 1`` of ``queries`` and ``out``: the ``i``-th sees the rows up to its own (``rows - query tokens + i``),
        within ``window`` rows ending there if a window is given; a lone query token sees all its rows. ``new key`` /
        ``new value``: 0, or (for a one-token sequence) where head 0 of its new K/V lie (float32; head ``j`` at ``j *
        new_heads[0]`` / ``[1]`` elements), copied into its last row first (rounded to float16 as torch rounds, if
        ``half``). ``H`` is a multiple of ``kv_heads``: query head ``h`` reads K/V head ``h // (H / kv_heads)``."""
        n, heads, d = len(table), queries.shape[1], queries.shape[2]
        rows = array.array("q", itertools.chain.from_iterable(table))  # row-major, as the C side reads it
        if len(rows) != n * _TABLE_FIELDS:
            raise ValueError(f"an attention table row has {_TABLE_FIELDS} fields")
        status = self._attention(
            n,
            kv_heads,
            heads // kv_heads,
            d,
            out.shape[-1],
            queries.data_ptr(),
            rows.buffer_info()[0],
            window or 0,
            float(softcap or 0.0),
            out.data_ptr(),
            *new_heads,
        )
        if status:
            raise NativeError("tc_attention could not allocate scratch memory")


def packed_offset(channel: int, in_features: int) -> int:
    """Where output channel ``channel`` (a multiple of :data:`INT8_CHANNEL_ALIGN`) starts in a packed weight with
    ``in_features`` inputs: a slice from there is the packed weight of the channels from ``channel`` on."""
    if channel % INT8_CHANNEL_ALIGN:
        raise ValueError(f"channel {channel} is not a multiple of {INT8_CHANNEL_ALIGN}")
    return channel * 4 * -(-in_features // 4)


def kernels() -> Kernels | None:
    """The kernels, built and loaded on first use; None when they cannot be had here (see the module docstring)."""
    if not _enabled[0]:
        return None
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the block on the torch paths (tests compare the two)."""
    before = _enabled[0]
    _enabled[0] = False
    try:
        yield
    finally:
        _enabled[0] = before


def _load() -> Kernels | None:
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        _log.warning("no C compiler (%s): the native kernels are off, torch's operations are used", compiler)
        return None
    try:
        path = _build(compiler)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("the native kernels could not be built (%s); torch's operations are used", exc)
        return None
    if lib.tc_abi_version() != ABI_VERSION:
        _log.warning("the native kernels at %s are of another version; torch's operations are used", path)
        return None
    if not lib.tc_supported():
        _log.info("this CPU lacks AVX-512 VNNI: the native kernels are off, torch's operations are used")
        return None
    return Kernels(lib)


def build_library(source: Path) -> ctypes.CDLL | None:
    """Another C source of turncache's (``blocks.c``) compiled and loaded as this module's library is: once per
    machine, same flags, same OpenMP runtime. None, logged, when it cannot be had here."""
    compiler = os.environ.get("CC") or "cc"
    if not _enabled[0] or shutil.which(compiler) is None:
        return None
    try:
        return ctypes.CDLL(str(_build(compiler, source)))
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("%s could not be built (%s); torch's operations are used", source.name, exc)
        return None


def _build(compiler: str, path: Path = SOURCE) -> Path:
    """The library's path, compiling it first unless a build for this source, compiler and CPU exists."""
    source = path.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(FLAGS).encode(), _cpu().encode()]))
    home = Path(os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache").expanduser()
    target = home / "native" / f"{'kernels' if path == SOURCE else path.stem}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), str(path)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: concurrent builders each install a whole file
    _log.info("built the native kernels: %s", target)
    return target


def _cpu() -> str:
    """This CPU's model and flags (a build is specific to them only through its digest; the code checks at run
    time what it uses)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))
