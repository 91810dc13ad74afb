"""turncache's two C kernels (``native.c``), for the two places where torch's own operations cost most per step:

- :meth:`Kernels.int8_linear`: an int8 linear layer. ``torch._int_mm`` takes a fast matrix-vector path for one row
  but repacks the weight on every call for two rows or more, so a batched decode step paid about 3x per weight byte
  what a one-sequence step paid. This kernel keeps the weight packed for AVX-512 VNNI (:meth:`Kernels.pack_int8`),
  reads each weight byte once for up to 8 rows (prefetching ahead of the stream), and gives the numbers of
  ``chat.models.hf.fast_paths.int8_linear`` bit for bit: the integer sums are exact and the float operations are the
  same, in the same order. It was faster than ``torch._int_mm`` at every row count measured (1 to 256).
- :meth:`Kernels.attention`: the attention of every sequence of a packed step over its own K/V rows, in one call per
  layer: decode tokens (whose new K/V it writes into the rows :mod:`chat.models.hf.ragged` reserved) and prefill
  chunks (causal, within the layer's sliding window). Torch's way was ~6 operations per sequence and layer, ~25 us
  each at short contexts, and SDPA's ~110 us per short chunk; for a 256-token chunk over 1,700 rows the kernel
  takes about what SDPA takes (7.0 vs 6.7 ms a layer). Each query token is computed the same way whatever else is
  in the call, so a position's attention does not depend on how its prompt was cut into chunks or batched.

Each output element is computed by one thread in a fixed order, whatever the number of rows or sequences in the
call, so a sequence's result inside a batch equals its result alone (the batched-exactness tests hold either way).

The contract with C is typed: the attention kernel's table is an array of :class:`AttentionRow` records, a
``ctypes.Structure`` that mirrors ``tc_attention_row`` in ``native.c`` field for field (its size and offsets are
compared with the library's own ``tc_attention_row_layout`` by a test, and :data:`ABI_VERSION` must equal the
library's ``tc_abi_version``). A row is checked when it is made and again against the call it goes into
(:class:`AttentionRowError`), so a wrong row raises in Python and never reaches C.

The library is compiled once per machine with the system C compiler (``$CC`` or ``cc``) into
``$TURNCACHE_HOME/native`` (by default ``~/.cache/turncache/native``), under a name that digests the source, the
compiler's version, the flags and the CPU model, and loaded with :mod:`ctypes`. The sha256 of the built file is
recorded beside it (``.sha256``), and a library is loaded only if its bytes still have that digest and its directory
belongs to the user alone (created 0700; one that others can write to, or under a directory others can rename
things in, is refused: :class:`UnsafeLibraryError`, logged, torch's operations used). It shares torch's OpenMP
runtime (it links ``libgomp`` by soname, which the loader resolves to the copy torch already mapped), so its threads
are the calling thread's torch threads and a serving process holds one OpenMP runtime (a test checks
``/proc/self/maps``). Without a compiler, on a CPU without AVX-512 VNNI, or with ``TURNCACHE_NATIVE=0``,
:func:`kernels` returns None and the callers keep their torch paths (logged once). Which path a model's int8 layers
take is fixed when they are built; attention decides at every call.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

_log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off")
INT8_CHANNEL_ALIGN = 32  # a packed weight's rows can be sliced at multiples of this many output channels
ABI_VERSION = 7  # tc_abi_version() of a library this module can call; changes with any signature or record
KV_DTYPES = {torch.float32: 0, torch.float16: 1}  # K/V rows the attention kernel reads -> AttentionRow.half
DIGEST_SUFFIX = ".sha256"  # beside a built library: the sha256 of its bytes, recorded when it was built

_lock = threading.Lock()
_loaded: list[Kernels | None] = []  # [] until the first call of kernels(); then [the kernels or None]
_enabled = [os.environ.get("TURNCACHE_NATIVE", "1") != "0"]

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class NativeError(RuntimeError):
    """A kernel could not allocate its scratch memory."""


class AttentionRowError(ValueError):
    """An attention table row that ``tc_attention`` must not be given (raised before any native call)."""


ROW_FIELDS = (
    "keys",  # address (bytes) of the first visible key row of K/V head 0
    "key_head_stride",  # elements between two heads' key rows
    "key_row_stride",  # elements between two key rows
    "values",  # likewise for the values
    "value_head_stride",
    "value_row_stride",
    "rows",  # visible rows; the sequence's query tokens are the last `queries` of them
    "new_key",  # 0, or (a one-token sequence) where head 0 of its new key lies, float32: copied into its last row
    "new_value",  # likewise for its new value
    "queries",  # query tokens
    "first",  # index of its first query token in the call's queries and output
    "half",  # 1: the K/V rows are float16; 0: float32
)


class AttentionRow(ctypes.Structure):
    """One sequence's row of the attention kernel's table: ``tc_attention_row`` in ``native.c``, field for field
    (:data:`ROW_FIELDS`; a test compares this layout with the library's own, ``tc_attention_row_layout``). Rows are
    made only by :meth:`AttentionTable.add`, which refuses one the kernel must not read."""

    _fields_ = [(name, ctypes.c_int64) for name in ROW_FIELDS]


_ADDRESS_LIMIT = 1 << 57  # above any user-space address on x86-64 (5-level paging included)
_COUNT_LIMIT = 1 << 40  # rows, strides and token indices: far above anything real, far below int64's overflow
_PACK = struct.Struct("=" + "q" * len(ROW_FIELDS))  # one AttentionRow's bytes, fields in ROW_FIELDS order
assert _PACK.size == ctypes.sizeof(AttentionRow)


class AttentionTable:
    """The rows of one attention call, packed into :class:`AttentionRow` records as they are added (one
    ``struct.pack_into`` each: a decode step adds a row per sequence and layer). Every row is checked as it is added
    (:class:`AttentionRowError`), and :meth:`Kernels.attention` checks the table against its call, so a wrong row
    never reaches C. The addresses themselves are vouched for by whoever owns the memory: :meth:`add_views` takes
    them from tensors, ``kv_rows`` from its own buffers."""

    __slots__ = ("_records", "count", "end", "key_row_stride", "new_kv", "value_row_stride")

    def __init__(self, capacity: int = 8) -> None:
        self._records = (AttentionRow * max(capacity, 1))()  # the packed rows; grows by doubling
        self.count = 0  # rows added
        self.end = 0  # one past the last query token of any row (the call needs at least this many tokens)
        self.key_row_stride = _COUNT_LIMIT  # the smallest of the rows' key row strides (>= D for the call)
        self.value_row_stride = _COUNT_LIMIT  # likewise for values (>= Dv)
        self.new_kv = False  # some row carries new K/V (the call needs their head strides)

    def add(
        self,
        keys: int,
        key_head_stride: int,
        key_row_stride: int,
        values: int,
        value_head_stride: int,
        value_row_stride: int,
        rows: int,
        *,
        queries: int,
        first: int,
        half: int,
        new_key: int = 0,
        new_value: int = 0,
    ) -> None:
        """Append one sequence's row (see :data:`ROW_FIELDS`: addresses in bytes, strides in elements).

        Raises:
            AttentionRowError: an address of 0 or out of range, a stride or count out of range, more query tokens
                than rows, ``half`` not 0 or 1, or new K/V that are not given together for a single query token.
        """
        if not (
            0 < keys < _ADDRESS_LIMIT
            and 0 < values < _ADDRESS_LIMIT
            and 0 < key_row_stride < _COUNT_LIMIT
            and 0 < value_row_stride < _COUNT_LIMIT
            and 0 <= key_head_stride < _COUNT_LIMIT
            and 0 <= value_head_stride < _COUNT_LIMIT
            and 1 <= queries <= rows < _COUNT_LIMIT
            and 0 <= first < _COUNT_LIMIT
            and (half == 0 or half == 1)
        ):
            raise AttentionRowError(
                f"bad attention row: keys={keys:#x} strides=({key_head_stride}, {key_row_stride}) values={values:#x} "
                f"strides=({value_head_stride}, {value_row_stride}) rows={rows} queries={queries} first={first} "
                f"half={half}"
            )
        if new_key or new_value:
            if not (queries == 1 and 0 < new_key < _ADDRESS_LIMIT and 0 < new_value < _ADDRESS_LIMIT):
                raise AttentionRowError(
                    f"new K/V ({new_key:#x}, {new_value:#x}) go together, for one query token (queries={queries})"
                )
            self.new_kv = True
        if self.count == len(self._records):
            grown = (AttentionRow * (2 * self.count))()
            ctypes.memmove(grown, self._records, ctypes.sizeof(self._records))
            self._records = grown
        _PACK.pack_into(
            self._records,
            self.count * _PACK.size,
            keys,
            key_head_stride,
            key_row_stride,
            values,
            value_head_stride,
            value_row_stride,
            rows,
            new_key,
            new_value,
            queries,
            first,
            half,
        )
        self.count += 1
        self.end = max(self.end, first + queries)
        self.key_row_stride = min(self.key_row_stride, key_row_stride)
        self.value_row_stride = min(self.value_row_stride, value_row_stride)

    def add_views(self, keys: torch.Tensor, values: torch.Tensor, *, queries: int, first: int) -> None:
        """Append the row of K/V views ``[Hk, rows, D]`` (CPU, float32 or float16, last dimension contiguous), whose
        last ``queries`` rows are the sequence's query positions, its first query token at ``first``.

        Raises:
            AttentionRowError: the views are not as described, or the row is wrong (see :meth:`add`).
        """
        half = KV_DTYPES.get(keys.dtype)
        if (
            half is None
            or values.dtype != keys.dtype
            or keys.dim() != 3
            or values.dim() != 3
            or keys.shape[:2] != values.shape[:2]
            or keys.stride(-1) != 1
            or values.stride(-1) != 1
            or keys.device.type != "cpu"
            or values.device.type != "cpu"
        ):
            raise AttentionRowError(
                f"K/V views must be CPU [Hk, rows, D] of one dtype in {[str(t) for t in KV_DTYPES]} with contiguous "
                f"rows, got {keys.dtype} {tuple(keys.shape)} / {values.dtype} {tuple(values.shape)}"
            )
        self.add(
            keys.data_ptr(),
            keys.stride(0),
            keys.stride(1),
            values.data_ptr(),
            values.stride(0),
            values.stride(1),
            keys.shape[1],
            queries=queries,
            first=first,
            half=half,
        )

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> AttentionRow:
        """Row ``i`` as packed (a copy)."""
        if not 0 <= i < self.count:
            raise IndexError(i)
        return AttentionRow.from_buffer_copy(self._records, i * _PACK.size)

    @property
    def records(self) -> Any:
        """The packed rows, as the ``tc_attention_row *`` argument."""
        return self._records


class Kernels:
    """The loaded library's entry points."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.abi_version = int(lib.tc_abi_version())  # ABI_VERSION, or the library is not used
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
        self._attention.argtypes = [_i64] * 5 + [_ptr, ctypes.POINTER(AttentionRow)] + [_i64, _f32, _ptr, _i64, _i64]
        self._attention.restype = ctypes.c_int
        self._row_layout = lib.tc_attention_row_layout
        self._row_layout.argtypes = [ctypes.POINTER(_i64), _i64]
        self._row_layout.restype = _i64

    def row_layout(self) -> tuple[int, ...]:
        """What the library says of its ``tc_attention_row``: ``(size, offset of each field in ROW_FIELDS order)``."""
        out = (_i64 * (1 + len(ROW_FIELDS)))()
        count = self._row_layout(out, len(out))
        return tuple(out[:count])

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
        table: AttentionTable,
        window: int | None,
        new_heads: tuple[int, int],
        out: torch.Tensor,
        softcap: float | None,
    ) -> None:
        """Fill ``out`` ``[T, H, Dv]`` (contiguous float32) with the attention of ``queries`` ``[T, H, D]``
        (contiguous float32, already scaled), one row of ``table`` per sequence.

        A sequence's query tokens are its last positions, tokens ``first .. first + queries - 1`` of ``queries`` and
        ``out``: the ``i``-th sees the rows up to its own (``rows - queries + i``), within ``window`` rows ending
        there if a window is given; a lone query token sees all its rows. Its K/V rows are float32, or float16 when
        ``half`` (read into float32). A row with a new key and value (one query token) has them copied into its last
        row first (float32 at those addresses, head ``j`` at ``j * new_heads[0]`` / ``[1]`` elements; rounded to
        float16 as torch rounds, if ``half``). ``H`` is a multiple of ``kv_heads``: query head ``h`` reads K/V head
        ``h // (H / kv_heads)``.

        Raises:
            AttentionRowError: ``table`` is not an :class:`AttentionTable`, or does not fit this call (query tokens
                outside ``queries``, rows shorter than ``D`` / ``Dv``, new K/V without their head strides).
            ValueError: the tensors are not as described.
        """
        if (
            queries.dtype != torch.float32
            or out.dtype != torch.float32
            or queries.dim() != 3
            or out.dim() != 3
            or not queries.is_contiguous()
            or not out.is_contiguous()
            or queries.device.type != "cpu"
            or out.device.type != "cpu"
            or out.shape[:2] != queries.shape[:2]
            or kv_heads < 1
            or queries.shape[1] % kv_heads
        ):
            raise ValueError(
                f"attention wants contiguous float32 CPU queries [T, H, D] and out [T, H, Dv] with H a multiple of "
                f"{kv_heads}, got {queries.dtype} {tuple(queries.shape)} and {out.dtype} {tuple(out.shape)}"
            )
        if type(table) is not AttentionTable:
            raise AttentionRowError(f"the attention table is an AttentionTable, not {type(table).__name__}")
        tokens, heads, d = queries.shape
        dv = out.shape[2]
        if (
            table.end > tokens
            or table.key_row_stride < d
            or table.value_row_stride < dv
            or (table.new_kv and min(new_heads) < 1)
        ):
            raise AttentionRowError(
                f"the table (query tokens up to {table.end}, row strides >= {table.key_row_stride} / "
                f"{table.value_row_stride}, new K/V {table.new_kv}) does not fit a call of {tokens} tokens, D {d} / "
                f"Dv {dv}, new head strides {new_heads}"
            )
        n = table.count
        status = self._attention(
            n,
            kv_heads,
            heads // kv_heads,
            d,
            dv,
            queries.data_ptr(),
            table.records,
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
        _check_private(path.parent)
        _check_digest(path)
        lib = ctypes.CDLL(str(path))
    except UnsafeLibraryError as exc:
        _log.warning("the native kernels are not loaded (%s); torch's operations are used", exc)
        return None
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


class UnsafeLibraryError(OSError):
    """A built library that must not be loaded: its directory could be written by another user, or its bytes are not
    those recorded when it was built."""


def build_directory() -> Path:
    """Where libraries are built: ``$TURNCACHE_HOME/native`` (``~/.cache/turncache/native`` by default)."""
    return Path(os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache").expanduser() / "native"


def build_library(source: Path) -> ctypes.CDLL | None:
    """Another C source of turncache's (``blocks.c``) compiled and loaded as this module's library is: once per
    machine, same flags, same OpenMP runtime, same private directory and digest check. None, logged, when it cannot
    be had here."""
    compiler = os.environ.get("CC") or "cc"
    if not _enabled[0] or shutil.which(compiler) is None:
        return None
    try:
        path = _build(compiler, source)
        _check_private(path.parent)
        _check_digest(path)
        return ctypes.CDLL(str(path))
    except UnsafeLibraryError as exc:
        _log.warning("%s is not loaded (%s); torch's operations are used", source.name, exc)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("%s could not be built (%s); torch's operations are used", source.name, exc)
        return None


def _build(compiler: str, path: Path = SOURCE) -> Path:
    """The library's path, compiling it first unless a build for this source, compiler and CPU exists with its
    recorded digest (a build without one, or whose bytes no longer match it, is built again). The directory is made
    private to the user (0700); a directory that others can write to is refused before anything is compiled there.

    Raises:
        UnsafeLibraryError: the build directory (or a directory above it) can be written by another user.
        OSError: the compiler failed.
    """
    source = path.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(FLAGS).encode(), _cpu().encode()]))
    stem = "kernels" if path == SOURCE else path.stem
    target = build_directory() / f"{stem}-{digest.hexdigest()[:16]}.so"
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(target.parent)
    recorded = target.with_name(target.name + DIGEST_SUFFIX)
    if target.exists() and recorded.exists():
        try:
            _check_digest(target)
            return target
        except UnsafeLibraryError as exc:
            _log.warning("%s; building it again", exc)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), str(path)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        note = Path(scratch) / recorded.name
        note.write_text(_file_digest(built) + "\n")
        os.replace(built, target)  # atomic: concurrent builders each install a whole file
        os.replace(note, recorded)  # the library first: a digest never describes a file that is not there yet
    _log.info("built the native kernels: %s", target)
    return target


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_digest(path: Path) -> None:
    """Raises UnsafeLibraryError unless ``path``'s sha256 is the one recorded beside it when it was built."""
    recorded = path.with_name(path.name + DIGEST_SUFFIX)
    try:
        want = recorded.read_text().strip()
    except OSError as exc:
        raise UnsafeLibraryError(f"{path} has no recorded digest ({recorded.name})") from exc
    if _file_digest(path) != want:
        raise UnsafeLibraryError(f"{path} is not the library that was built there (its sha256 changed)")


def _check_private(directory: Path) -> None:
    """Raises UnsafeLibraryError unless only this user (or root) can change what ``directory`` holds: it is owned by
    this user and not writable by group or others, and every directory above it is owned by this user or root and
    either not writable by others or sticky (so that nobody else can move the entries below it)."""
    uid = os.getuid()
    path = directory.resolve()
    info = path.stat()
    if info.st_uid != uid or info.st_mode & 0o022:
        raise UnsafeLibraryError(
            f"{path} must belong to this user and be writable by nobody else (mode {stat.filemode(info.st_mode)}, "
            f"owner {info.st_uid})"
        )
    for parent in path.parents:
        info = parent.stat()
        if info.st_uid not in (uid, 0) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            raise UnsafeLibraryError(
                f"{parent}, above the build directory {path}, can be changed by other users "
                f"(mode {stat.filemode(info.st_mode)}, owner {info.st_uid})"
            )


def _cpu() -> str:
    """This CPU's model and flags (a build is specific to them only through its digest; the code checks at run
    time what it uses)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))
