"""The files of the prefix cache's disk tier: names, digests, and (de)serialization with safetensors.

Two kinds of file, both safetensors (string metadata, named tensors), under ``<cache dir>/v1/``:

- **entry files** ``entries/<name>.safetensors``, one per cache entry. Metadata: ``format``, ``version``,
  ``namespace`` (a digest of the namespace: never its salt), ``entry`` (JSON: tokens, media spans, extras, one
  description per layer, the chunks it uses, its layout digest) and ``checksum`` (CRC-32 of its tensors). Tensors:
  the rows of normal layers after the last full chunk (``L<i>.k`` / ``L<i>.v``), the rows of rotating layers, and
  recurrent snapshots (``L<i>.s<length>.<j>``). ``name`` is a digest of (namespace digest, entry JSON), so a file
  that was renamed, swapped or edited fails the name check.
- **chunk files** ``chunks/<digest>.safetensors``: the K/V rows of every normal layer for the positions
  ``[j*C, (j+1)*C)`` of a sequence (``C`` = chunk tokens). The digest chains over the namespace digest and the index
  keys (tokens, media positions re-keyed: :mod:`cache.media`) of ``[0, (j+1)*C)``, so entries that share a prefix
  share its chunks and extending a conversation writes only its new chunks. Metadata: ``format``, ``version``,
  ``chunk`` (its own digest) and ``checksum``.

Every function that reads a file raises :class:`DiskFormatError` on anything unexpected: truncated or corrupt
files, foreign formats or versions, a digest that does not match, tensors of the wrong shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cache.layers import LayerState, NormalKV, RecurrentState, RotatingKV, Stateless, signature
from cache.media import MediaKind, MediaSpan
from cache.namespace import Namespace

FORMAT_VERSION = "1"
ENTRY_FORMAT = "turncache-prefix-entry"
CHUNK_FORMAT = "turncache-prefix-chunk"
SUFFIX = ".safetensors"
DEFAULT_CHUNK_TOKENS = 256


class DiskFormatError(Exception):
    """A file is unreadable, corrupt, truncated, foreign, or does not say what its name says."""


# ==================================================================== digests


def namespace_digest(namespace: Namespace) -> str:
    """A one-way digest of (model fingerprint, dtype, salt, tagged components): what files store instead of the
    namespace. A namespace without components hashes as it did before components existed; one with them hashes a
    JSON array of every field under another prefix, so that no salt can spell a component (nor the reverse)."""
    if not namespace.components:
        text = f"turncache-namespace\0{namespace.model}\0{namespace.dtype}\0{namespace.salt}"
    else:
        fields = [namespace.model, namespace.dtype, namespace.salt, [list(pair) for pair in namespace.components]]
        text = "turncache-namespace-2" + json.dumps(fields)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def layout_digest(layers: Sequence[LayerState]) -> str:
    """Digest of the layers' signatures (kind, shapes apart from length, dtype, window)."""
    return signatures_digest(tuple(signature(s) for s in layers))


def signatures_digest(signatures: tuple) -> str:
    """Digest of a namespace layout (a tuple of :func:`cache.layers.signature` values)."""
    return hashlib.blake2b(repr(signatures).encode(), digest_size=16).hexdigest()


def _key_bytes(keys: array) -> bytes:
    if sys.byteorder == "big":
        keys = array("q", keys)
        keys.byteswap()
    return keys.tobytes()


def chunk_digests(ns_digest: str, keys: array, chunk_tokens: int) -> tuple[str, ...]:
    """Digests of the full chunks of a sequence with these index keys (a partial last chunk has none)."""
    out = []
    state = hashlib.blake2b(f"turncache-chunks\0{ns_digest}".encode(), digest_size=16).digest()
    for start in range(0, len(keys) - chunk_tokens + 1, chunk_tokens):
        state = hashlib.blake2b(state + _key_bytes(keys[start : start + chunk_tokens]), digest_size=16).digest()
        out.append(state.hex())
    return tuple(out)


def entry_name(ns_digest: str, header: str) -> str:
    return hashlib.blake2b(f"{ns_digest}\0{header}".encode(), digest_size=20).hexdigest()


def checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """CRC-32 of the tensors' bytes, in name order (corruption and truncation; names guard against swaps)."""
    crc = 0
    for name in sorted(tensors):
        crc = zlib.crc32(name.encode(), crc)
        flat = tensors[name].detach().contiguous().reshape(-1)
        if flat.numel():
            crc = zlib.crc32(memoryview(flat.view(torch.uint8).numpy()), crc)
    return f"{crc:08x}"


# ==================================================================== extras (a step function of JSON-able values)


class UnserializableError(Exception):
    """An extras value has a type the disk format cannot store exactly."""


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return {"i": str(value)}  # exact at any size
    if isinstance(value, float):
        return {"f": value.hex()}  # exact, NaN and infinities included
    if isinstance(value, tuple):
        return {"t": [_encode_value(v) for v in value]}
    if isinstance(value, list):
        return {"l": [_encode_value(v) for v in value]}
    raise UnserializableError(f"cannot store an extras value of type {type(value).__name__}")


def _decode_value(data: Any) -> Any:
    if data is None or isinstance(data, bool | str):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((tag, inner),) = data.items()
        if tag == "i" and isinstance(inner, str):
            return int(inner)
        if tag == "f" and isinstance(inner, str):
            return float.fromhex(inner)
        if tag in ("t", "l") and isinstance(inner, list):
            items = [_decode_value(v) for v in inner]
            return tuple(items) if tag == "t" else items
    raise DiskFormatError(f"bad extras value {data!r:.80}")


# ==================================================================== the entry header


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """What an entry file says about its entry, apart from tensors. Enough to index it without loading them."""

    tokens: array  # the full token sequence (int64; the cache entry's own array when planned from one)
    media: tuple[MediaSpan, ...]  # sorted media spans
    extras: tuple[tuple[int, Any], ...]  # the step function of adapter state
    layers: tuple[dict, ...]  # per layer: {"kind": ..., and what that kind needs}; see describe_layers
    chunks: tuple[str, ...]  # digests of the chunk files holding the first len(chunks) * chunk_tokens rows
    chunk_tokens: int  # C
    layout: str  # layout digest of the layers
    nbytes: int  # tensor bytes of the entry, chunks included (what the disk budget counts)

    def to_json(self) -> str:
        return json.dumps(
            {
                "tokens": list(self.tokens),
                "media": [[s.start, s.end, s.kind.value, s.content_hash] for s in self.media],
                "extras": [[start, _encode_value(v)] for start, v in self.extras],
                "layers": list(self.layers),
                "chunks": list(self.chunks),
                "chunk_tokens": self.chunk_tokens,
                "layout": self.layout,
                "nbytes": self.nbytes,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> EntryHeader:
        """Raises DiskFormatError."""
        try:
            data = json.loads(text)
            if not data["tokens"] or not all(type(t) is int and 0 <= t < 2**31 for t in data["tokens"]):
                raise DiskFormatError("bad tokens")
            tokens = array("q", data["tokens"])
            media = tuple(MediaSpan(int(a), int(b), MediaKind(k), str(h)) for a, b, k, h in data["media"])
            extras = tuple((int(start), _decode_value(v)) for start, v in data["extras"])
            layers = tuple(data["layers"])
            if not layers or not all(isinstance(d, dict) and d.get("kind") in _KINDS for d in layers):
                raise DiskFormatError("bad layer descriptions")
            chunks = tuple(str(c) for c in data["chunks"])
            chunk_tokens = int(data["chunk_tokens"])
            if chunk_tokens < 1 or len(chunks) * chunk_tokens > len(tokens):
                raise DiskFormatError("chunks beyond the sequence")
            nbytes = int(data["nbytes"])
            if nbytes < 0:
                raise DiskFormatError("negative size")
            return EntryHeader(tokens, media, extras, layers, chunks, chunk_tokens, str(data["layout"]), nbytes)
        except DiskFormatError:
            raise
        except Exception as exc:  # KeyError, TypeError, ValueError, the cache's own errors, ...
            raise DiskFormatError(f"bad entry header: {exc}") from exc

    def limits(self) -> tuple[int, list[set[int]]]:
        """The shortest length the rotating layers allow, and the snapshot lengths of each recurrent layer.

        Raises:
            DiskFormatError: a layer description lacks a field or has one of the wrong type.
        """
        try:
            lo, point_sets = 0, []
            for d in self.layers:
                if d["kind"] == "rotating":
                    first = int(d["seen"]) - int(d["rows"])
                    lo = max(lo, 0 if first == 0 else first + int(d["window"]) - 1)
                elif d["kind"] == "recurrent":
                    point_sets.append({int(p) for p in d["points"]})
            return lo, point_sets
        except (KeyError, TypeError, ValueError) as exc:
            raise DiskFormatError(f"bad layer description: {exc}") from exc


_KINDS = ("normal", "rotating", "recurrent", "stateless")


def describe_layers(layers: Sequence[LayerState]) -> tuple[dict, ...]:
    out: list[dict] = []
    for state in layers:
        if isinstance(state, NormalKV):
            out.append({"kind": "normal"})
        elif isinstance(state, RotatingKV):
            out.append({"kind": "rotating", "window": state.window, "seen": state.seen, "rows": state.rows})
        elif isinstance(state, RecurrentState):
            first = next(iter(state.snapshots.values()))
            out.append({"kind": "recurrent", "points": sorted(state.snapshots), "tensors": len(first)})
        else:
            out.append({"kind": "stateless"})
    return tuple(out)


def payload_bytes(layers: Sequence[LayerState]) -> int:
    """Bytes of tensor data an entry's files hold (rows actually held, not the buffers they view)."""
    total = 0
    for state in layers:
        if isinstance(state, NormalKV | RotatingKV):
            total += state.keys.numel() * state.keys.element_size()
            total += state.values.numel() * state.values.element_size()
        elif isinstance(state, RecurrentState):
            total += sum(t.numel() * t.element_size() for ts in state.snapshots.values() for t in ts)
    return total


# ==================================================================== tensors to write (on the writer thread)


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def chunk_tensors(layers: Sequence[LayerState], index: int, chunk_tokens: int) -> dict[str, torch.Tensor]:
    lo, hi = index * chunk_tokens, (index + 1) * chunk_tokens
    out = {}
    for i, state in enumerate(layers):
        if isinstance(state, NormalKV):
            out[f"L{i}.k"] = _cpu_copy(state.keys[..., lo:hi, :])
            out[f"L{i}.v"] = _cpu_copy(state.values[..., lo:hi, :])
    return out


def entry_tensors(layers: Sequence[LayerState], chunked_rows: int) -> dict[str, torch.Tensor]:
    out = {}
    for i, state in enumerate(layers):
        if isinstance(state, NormalKV):
            out[f"L{i}.k"] = _cpu_copy(state.keys[..., chunked_rows:, :])
            out[f"L{i}.v"] = _cpu_copy(state.values[..., chunked_rows:, :])
        elif isinstance(state, RotatingKV):
            out[f"L{i}.k"] = _cpu_copy(state.keys)
            out[f"L{i}.v"] = _cpu_copy(state.values)
        elif isinstance(state, RecurrentState):
            for length, tensors in state.snapshots.items():
                for j, t in enumerate(tensors):
                    out[f"L{i}.s{length}.{j}"] = _cpu_copy(t)
    return out


def write_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> int:
    """Write atomically (a temporary file in the same directory, then rename). Returns the file's size.

    Raises:
        OSError: the directory is missing, read-only or full (the temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={**metadata, "checksum": checksum(tensors)})
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def entry_metadata(ns_digest: str, header: str) -> dict[str, str]:
    return {"format": ENTRY_FORMAT, "version": FORMAT_VERSION, "namespace": ns_digest, "entry": header}


def chunk_metadata(digest: str) -> dict[str, str]:
    return {"format": CHUNK_FORMAT, "version": FORMAT_VERSION, "chunk": digest}


# ==================================================================== reading


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata of a safetensors file, reading only its header (tensors stay on disk).

    Raises:
        DiskFormatError: not a complete safetensors file.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as exc:
        raise DiskFormatError(f"{path.name}: unreadable ({exc})") from exc


def check_kind(meta: Mapping[str, str], fmt: str, path: Path) -> None:
    if meta.get("format") != fmt or meta.get("version") != FORMAT_VERSION:
        raise DiskFormatError(
            f"{path.name}: foreign file (format {meta.get('format')!r}, version {meta.get('version')!r})"
        )


def read_tensors(path: Path, fmt: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Metadata and tensors of a file whose checksum matches.

    Raises:
        DiskFormatError: unreadable, foreign, or the checksum does not match.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            check_kind(meta, fmt, path)
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except DiskFormatError:
        raise
    except Exception as exc:
        raise DiskFormatError(f"{path.name}: unreadable ({exc})") from exc
    if meta.get("checksum") != checksum(tensors):
        raise DiskFormatError(f"{path.name}: checksum mismatch")
    return meta, tensors


def build_layers(
    header: EntryHeader, own: Mapping[str, torch.Tensor], chunks: Sequence[Mapping[str, torch.Tensor]]
) -> tuple[LayerState, ...]:
    """The entry's layer states from its own tensors and its chunks' tensors (in order).

    Raises:
        DiskFormatError: a tensor is missing or has the wrong shape, or the states contradict the header.
    """
    length = len(header.tokens)
    try:
        out: list[LayerState] = []
        for i, d in enumerate(header.layers):
            kind = d["kind"]
            if kind == "normal":
                keys = _rows(own[f"L{i}.k"], [c[f"L{i}.k"] for c in chunks], length)
                values = _rows(own[f"L{i}.v"], [c[f"L{i}.v"] for c in chunks], length)
                out.append(NormalKV(keys, values))
            elif kind == "rotating":
                state = RotatingKV(own[f"L{i}.k"], own[f"L{i}.v"], int(d["window"]), int(d["seen"]))
                if state.rows != d["rows"] or state.seen != length:
                    raise DiskFormatError(f"layer {i}: rotating rows disagree with the header")
                out.append(state)
            elif kind == "recurrent":
                n = int(d["tensors"])
                snapshots = {int(p): tuple(own[f"L{i}.s{p}.{j}"] for j in range(n)) for p in d["points"]}
                out.append(RecurrentState(snapshots))
            else:
                out.append(Stateless())
    except DiskFormatError:
        raise
    except Exception as exc:  # KeyError (missing tensor), the layer types' own checks, torch shape errors
        raise DiskFormatError(f"entry tensors do not fit its header: {exc}") from exc
    if layout_digest(out) != header.layout:
        raise DiskFormatError("entry tensors do not match the layout digest")
    return tuple(out)


def _rows(tail: torch.Tensor, chunk_rows: Sequence[torch.Tensor], length: int) -> torch.Tensor:
    """The chunks' rows followed by the tail's, as one tensor of ``length`` rows.

    Raises:
        DiskFormatError: the parts disagree in shape or dtype, or do not add up to ``length`` rows.
    """
    parts = (*chunk_rows, tail)
    held = 0
    for part in parts:
        if (
            part.dim() < 2
            or part.dtype != tail.dtype
            or (part.shape[:-2], part.shape[-1])
            != (
                tail.shape[:-2],
                tail.shape[-1],
            )
        ):
            raise DiskFormatError(f"chunk rows {tuple(part.shape)} {part.dtype} do not fit {tuple(tail.shape)}")
        held += part.shape[-2]
    if held != length:
        raise DiskFormatError(f"normal layer holds {held} rows, the entry has {length} tokens")
    if not chunk_rows:
        return tail
    return torch.cat(parts, dim=-2)
