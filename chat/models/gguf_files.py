"""Any local GGUF file (llama.cpp, Ollama, LM Studio): what it is and whether it can be served, read before any
weights are (:mod:`chat.models.hf.gguf_model` then loads it straight from its bytes; nothing is written to disk but the
record of its digest and the config and tokenizer built from its metadata: :mod:`chat.models.hf.metadata_store`).
One file, step by step::

    check_magic(path)          4 bytes: refuse a file that is not GGUF before hashing it
    identify(path)             size, mtime and sha256 of its bytes (the cache namespace's weights digest); the sha256
                               is computed once per (path, size, mtime) and remembered under
                               models_home()/gguf/.identities
    read_header + check_header the metadata and tensor table: truncated or corrupt files, parts of split files,
                               files without tensors, architectures transformers cannot read or turncache does not
                               serve, tensor types that cannot be dequantized: each a typed error naming the file,
                               before any weights are read; check_header returns the model config transformers
                               builds from the metadata

A file whose metadata has no ``tokenizer.chat_template`` is a base model: it loads and serves completions; chat
turns are refused (``no_chat_template``) rather than rendered with a guessed template (ChatML, say), which would
give prompts the model was never trained on without anyone noticing; ``--chat-template`` gives it one. A GGUF file
holds data only (no pickles, no code): reading one executes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import mmap
import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chat.models.errors import ModelFileError, UnsupportedArchitectureError
from chat.models.families import check_config

_log = logging.getLogger(__name__)

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # GGUF versions read here (v1 counted in 32 bits; no file in use still has it)
GGUF_DIR = "gguf"  # under models_home(): the identity records
IDENTITY_DIR = ".identities"  # under models_home()/gguf: remembered sha256 of each file by path, size, mtime
DEFAULT_ALIGNMENT = 32  # of the tensor data section, unless general.alignment says otherwise
MAX_DIMS = 4  # ggml tensors have at most four dimensions

# GGUF general.architecture -> the name transformers lists it under (transformers renames these on load)
_TRANSFORMERS_ARCH = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
}
# GGUF general.architecture -> the model_type of the config transformers builds from it, where they differ
_MODEL_TYPE = {
    **_TRANSFORMERS_ARCH,
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
    "qwen35": "qwen3_5_text",
    "qwen35moe": "qwen3_5_moe_text",
}
_NOT_ARCHITECTURES = {"general", "tokenizer"}  # metadata prefixes transformers' table lists beside the archs
# tensors the loaders skip although they change what the model computes -> what is lost (the model is served without
# them; every load logs a warning)
IGNORED_TENSORS = {
    "rope_freqs.weight": "Llama 3.1-style rope scaling (per-frequency factors); the model rotates with the "
    "unscaled rope frequencies, so its logits differ slightly from llama.cpp's on the same file",
}

# GGUF metadata value types (gguf.constants.GGUFValueType) -> struct format, for the fixed-size ones
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def models_home() -> Path:
    """``$TURNCACHE_HOME/models``, by default ``~/.cache/turncache/models``."""
    home = os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache"
    return Path(home).expanduser() / "models"


# ==================================================================== the file's identity


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What a GGUF file is: the record of its digest and the cache namespace's weights digest."""

    size: int  # bytes
    mtime_ns: int  # modification time when the sha256 was computed
    sha256: str  # hex digest of the file's bytes


@dataclass(frozen=True, slots=True)
class Tensor:
    """One entry of a GGUF tensor table."""

    name: str  # llama.cpp's name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]  # in ggml order (fastest-moving dimension first)
    ggml_type: int  # gguf.GGMLQuantizationType value
    offset: int  # from the start of the data section
    nbytes: int  # bytes it occupies


@dataclass(frozen=True, slots=True)
class GgufHeader:
    """A GGUF file's metadata and tensor table (no tensor data read)."""

    path: Path  # the file
    version: int  # GGUF format version
    architecture: str  # general.architecture
    metadata: dict[str, Any]  # scalars and strings by key; arrays as their element count
    tensors: tuple[Tensor, ...]  # the tensor table, in file order
    data_start: int  # where the (aligned) tensor data section begins


def check_magic(path: Path) -> None:
    """Raise unless ``path`` is a readable regular file that starts with the GGUF magic bytes.

    Raises:
        ModelFileError: no such file, not a regular file, unreadable, or not GGUF.
    """
    try:
        with path.open("rb") as f:
            start = f.read(4)
    except FileNotFoundError:
        raise ModelFileError(path, "no such file") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a directory, not a GGUF file") from None
    except OSError as exc:
        raise ModelFileError(path, f"cannot be read ({exc.strerror or exc})") from exc
    if start != MAGIC:
        raise ModelFileError(
            path, f"is not a GGUF file: it starts with {start!r}, not {MAGIC!r} (give a GGUF file or a model directory)"
        )


def identify(path: Path) -> FileIdentity:
    """Size, mtime and sha256 of ``path``. The sha256 is computed once for a given (path, size, mtime) and kept in a
    small record under ``models_home()/gguf/.identities``; a file rewritten in place with its size and mtime kept
    is not noticed (as with make or rsync).

    Raises:
        ModelFileError: the file cannot be read.
    """
    try:
        stat = path.stat()
        fields = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        record = _identity_record(path)
        known = _recall(record)
        if {key: known.get(key) for key in fields} == fields and isinstance(known.get("sha256"), str):
            return FileIdentity(stat.st_size, stat.st_mtime_ns, known["sha256"])
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise ModelFileError(path, f"cannot be read ({exc.strerror or exc})") from exc
    _remember(record, {**fields, "sha256": digest})
    return FileIdentity(stat.st_size, stat.st_mtime_ns, digest)


# ==================================================================== the header


def read_header(path: Path) -> GgufHeader:
    """Parse the metadata and tensor table of ``path`` and check that every tensor's bytes lie inside the file.
    String arrays (vocabulary, merges) are walked, not kept.

    Raises:
        ModelFileError: not GGUF, a GGUF version not read here, truncated, or corrupt (inconsistent table).
    """
    check_magic(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            return _parse(path, _Cursor(blob))
    except _Truncated as exc:
        raise ModelFileError(path, f"is truncated or corrupt: {exc}") from None
    except OSError as exc:
        raise ModelFileError(path, f"cannot be read ({exc.strerror or exc})") from exc


def check_header(header: GgufHeader, family: bool = True) -> Any:
    """Refuse, before any weights are read, what transformers cannot load or turncache cannot serve; return the
    model config transformers builds from the metadata (None without ``family``: the config is neither built nor
    checked, for a file whose config was checked before).

    Raises:
        UnsupportedArchitectureError: transformers has no GGUF loader for the architecture, or its family is refused
            by :func:`chat.models.families.check_config` (``.supported`` lists the GGUF architectures served).
        ModelFileError: tensors in a type transformers cannot dequantize (named, with the types it can), one part of
            a split file, no tensors, or a config transformers cannot build.
    """
    arch, path = header.architecture, header.path
    parts, number = header.metadata.get("split.count", 1), header.metadata.get("split.no")
    if isinstance(parts, int) and parts > 1:
        which = f"part {number + 1}" if isinstance(number, int) else "a part"
        raise ModelFileError(
            path,
            f"is {which} of a GGUF split into {parts} files, which transformers cannot load; merge the parts first "
            "(llama.cpp: llama-gguf-split --merge FIRST-PART OUT.gguf)",
        )
    if not header.tensors:
        raise ModelFileError(path, "holds no tensors (a vocabulary-only GGUF?); give the model's weights file")
    if _TRANSFORMERS_ARCH.get(arch, arch) not in transformers_architectures():
        raise UnsupportedArchitectureError(
            arch, f"transformers cannot read GGUF files of this architecture ({path})", served_architectures()
        )
    readable = readable_types(arch)
    unreadable = sorted({t.ggml_type for t in header.tensors} - readable)
    if unreadable:
        first = next(t.name for t in header.tensors if t.ggml_type == unreadable[0])
        raise ModelFileError(
            path,
            f"holds tensors of type {', '.join(map(_type_name, unreadable))} (e.g. {first}), which transformers "
            f"cannot dequantize; it reads {', '.join(sorted(map(_type_name, readable)))}",
        )
    return _check_family(header) if family else None


@functools.cache
def transformers_architectures() -> frozenset[str]:
    """GGUF architectures whose files transformers can load (its legacy table and its newer per-arch loaders)."""
    from transformers.integrations.gguf import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return frozenset(set(GGUF_SUPPORTED_ARCHITECTURES) - _NOT_ARCHITECTURES | set(GGUF_ARCHS))


@functools.cache
def served_architectures() -> tuple[str, ...]:
    """GGUF architectures that transformers reads and whose family turncache serves (judged on each family's
    default config: a file's own config is checked again before it is loaded)."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    served = []
    to_file = {v: k for k, v in _TRANSFORMERS_ARCH.items()}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # default configs warn about their own token ids (starcoder2's)
    try:
        for name in sorted(transformers_architectures()):
            arch = to_file.get(name, name)
            try:
                check_config(AutoConfig.for_model(_MODEL_TYPE.get(arch, arch)))
            except Exception:  # unknown to AutoConfig, or refused: not served
                continue
            served.append(arch)
    finally:
        hf_logging.set_verbosity(verbosity)
    return tuple(served)


@functools.cache
def readable_types(architecture: str) -> frozenset[int]:
    """The ggml tensor types transformers dequantizes for files of ``architecture``: found by dequantizing one zero
    block of each type the way its loader for that architecture does (gguf-py, or transformers' own kernels)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from transformers.integrations.gguf import GGUF_ARCHS

    if architecture in GGUF_ARCHS:  # transformers' newer loader: plain floats and its own block formats
        from transformers.integrations.gguf.dequant import GGML_BLOCK

        plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
        return frozenset({int(t) for t in plain} | set(GGML_BLOCK))
    from gguf.quants import dequantize

    readable = set()
    for qtype in GGMLQuantizationType:
        _, type_size = GGML_QUANT_SIZES[qtype]
        try:
            dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except (NotImplementedError, ValueError, TypeError):
            continue
        readable.add(int(qtype))
    return frozenset(readable)


# ==================================================================== helpers


class _Truncated(Exception):
    """The header reads past the end of the file, or contradicts itself."""


class _Cursor:
    """Little-endian reads from a memory-mapped file; every read past its end raises _Truncated."""

    def __init__(self, blob: mmap.mmap) -> None:
        self.blob = blob  # the whole file, read-only
        self.size = len(blob)  # its length
        self.pos = 0  # the next byte to read

    def take(self, fmt: str) -> Any:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise _Truncated(f"the header needs byte {self.pos + width:,} but the file has {self.size:,}")
        (value,) = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += width
        return value

    def skip(self, count: int) -> None:
        if count < 0 or self.pos + count > self.size:
            raise _Truncated(f"the header needs byte {self.pos + count:,} but the file has {self.size:,}")
        self.pos += count

    def string(self) -> str:
        length = self.take("<Q")
        start = self.pos
        self.skip(length)
        try:
            return bytes(self.blob[start : self.pos]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Truncated(f"a string at byte {start:,} is not UTF-8") from exc

    def value(self, value_type: int) -> Any:
        if value_type in _SCALAR:
            return self.take(_SCALAR[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element_type, count = self.take("<I"), self.take("<Q")
            if element_type in _SCALAR:
                self.skip(count * struct.calcsize(_SCALAR[element_type]))
            elif element_type == _STRING:
                for _ in range(count):
                    self.skip(self.take("<Q"))
            else:
                raise _Truncated(f"an array of unknown value type {element_type}")
            return count
        raise _Truncated(f"a metadata value of unknown type {value_type}")


def _parse(path: Path, cur: _Cursor) -> GgufHeader:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    cur.skip(len(MAGIC))
    version = cur.take("<I")
    if version not in VERSIONS:
        raise ModelFileError(path, f"is GGUF version {version}; versions {' and '.join(map(str, VERSIONS))} are read")
    tensor_count, kv_count = cur.take("<Q"), cur.take("<Q")
    if tensor_count > cur.size or kv_count > cur.size:
        raise _Truncated(f"it claims {tensor_count:,} tensors and {kv_count:,} metadata entries")
    metadata = {}
    for _ in range(kv_count):
        key = cur.string()
        metadata[key] = cur.value(cur.take("<I"))
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise ModelFileError(path, "has no general.architecture in its metadata")
    entries = []
    for _ in range(tensor_count):
        name, dims = cur.string(), cur.take("<I")
        if dims > MAX_DIMS:
            raise _Truncated(f"tensor {name} has {dims} dimensions")
        shape = tuple(cur.take("<Q") for _ in range(dims))
        type_id, offset = cur.take("<I"), cur.take("<Q")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        except ValueError:
            raise ModelFileError(path, f"tensor {name} has the unknown ggml type id {type_id}") from None
        elements = math.prod(shape)
        if shape and shape[0] % block:
            raise _Truncated(f"tensor {name} has rows of {shape[0]} values, not whole blocks of {block}")
        entries.append(Tensor(name, shape, type_id, offset, elements // block * type_size))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Truncated(f"general.alignment is {alignment!r}, not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    for tensor in entries:
        end = data_start + tensor.offset + tensor.nbytes
        if end > cur.size:
            raise _Truncated(f"tensor {tensor.name} ends at byte {end:,} but the file has {cur.size:,}")
    return GgufHeader(path, version, architecture, metadata, tuple(entries), data_start)


@dataclass(frozen=True, slots=True)
class FileTensor:
    """One tensor of the file, its bytes a view of a read-only memory map (what gguf.GGUFReader gives, without
    parsing the metadata again)."""

    name: str  # llama.cpp's name
    shape: tuple[int, ...]  # in ggml order (fastest-moving dimension first)
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # plain types: their values; block types: uint8 [..., bytes per row]


_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32}


def tensors(path: Path, header: Any) -> Iterator[FileTensor]:
    """The file's tensors from the table :func:`chat.models.gguf_files.read_header` checked (every tensor's bytes
    lie inside the file)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    blob = np.memmap(path, dtype=np.uint8, mode="r")
    for t in header.tensors:
        qtype = GGMLQuantizationType(t.ggml_type)
        start = header.data_start + t.offset
        raw, dims = blob[start : start + t.nbytes], tuple(reversed(t.shape)) or (1,)
        if qtype.name in _PLAIN:
            data = raw.view(_PLAIN[qtype.name]).reshape(dims)
        else:
            per_block, block_bytes = GGML_QUANT_SIZES[qtype]
            data = raw.reshape(*dims[:-1], dims[-1] // per_block * block_bytes)
        yield FileTensor(t.name, t.shape, qtype, data)


def raw_bytes(data: np.ndarray) -> np.ndarray:
    """A tensor's bytes as uint8 ``[rows, bytes per row]`` (16-bit float tensors come as their values)."""
    return data if data.dtype == np.uint8 else data.view(np.uint8)


def _check_family(header: GgufHeader) -> Any:
    """The config transformers derives from the metadata, once turncache's family check passed on it (transformers
    parses the whole metadata: about a second for SmolLM2's 49k-token vocabulary, more on a busy machine)."""
    from transformers import AutoConfig

    path = header.path
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:  # transformers raises what it likes on metadata it does not expect
        raise ModelFileError(path, f"transformers cannot build a model config from its metadata ({exc})") from exc
    check_family(config, path)
    return config


def check_family(config: Any, path: Path) -> None:
    """Raise unless turncache serves the family of ``config``, the config built from the GGUF file ``path``.

    Raises:
        UnsupportedArchitectureError: the family is refused (naming the file; ``.supported`` lists the GGUF
            architectures served).
    """
    try:
        check_config(config)
    except UnsupportedArchitectureError as exc:
        raise UnsupportedArchitectureError(exc.architecture, f"{exc.reason} ({path})", served_architectures()) from exc


def _type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(type_id).name


def _identity_record(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return models_home() / GGUF_DIR / IDENTITY_DIR / f"{key}.json"


def _recall(record: Path) -> dict[str, Any]:
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: the digest is computed again
    return known if isinstance(known, dict) else {}


def _remember(record: Path, fields: dict[str, Any]) -> None:
    """Write ``record`` atomically; a cache of a digest, so failing to write it only costs a later re-hash."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".", dir=record.parent)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(fields) + "\n")
        os.replace(tmp, record)
    except OSError:
        pass
