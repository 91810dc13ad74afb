"""Content identity of media items, and parsing of the ``data:`` URLs that carry them.

Two digests, computed at different times:

- :func:`media_digest`: sha256 of an item's encoded bytes (:data:`MediaDigest`). A request's media is hashed once,
  when its wire form is validated (``chat.protocol.content``), and the digest travels with the stored message, so a
  later turn of the same conversation neither decodes nor hashes that item again.
- :func:`content_hash`: the item as model input (:data:`ContentHash`), from the bytes' digest and a fingerprint of
  the settings that turn bytes into model input::

    content_hash = sha256( b"turncache-media/2\\0" + sha256(canonical JSON of {kind, processor, settings})
                           + sha256(data) )

Both are computed from the bytes alone, before any decoding, so a cache hit can skip decoding and encoding; the
second costs a few hundred bytes of hashing whatever the item's size. Equal content hashes mean equal model input as
long as the fingerprint lists every setting that affects it (processor class, max_pixels, sample rate, frame count /
fps, EXIF policy, and each decoder's own ``DECODER_VERSION``). A setting left out can cause a wrong hit; a setting
written differently (``2`` and ``2.0`` are normalized, ``[1, 2]`` and ``(1, 2)`` too) only costs a miss.

Remote URLs (``http:``, ``https:``, ``file:``, ...) are refused with :class:`MediaURLError`: this package never
touches the network or the filesystem.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NewType

from modalities.errors import ItemRef, MediaTooLargeError, MediaURLError

ContentHash = NewType("ContentHash", str)
"""Identity of a media item as model input: 64 lowercase hex digits (see the module docstring). The one type of it:
the cache, which imports nothing of turncache, keeps and compares it as the ``str`` it is."""

MediaDigest = NewType("MediaDigest", str)
"""sha256 of an item's encoded bytes, 64 lowercase hex digits: what a request sent, before any settings apply."""

_DOMAIN = b"turncache-media/2\0"


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The settings between bytes and model input, in canonical form. Build it with :func:`fingerprint`."""

    text: str  # canonical JSON of {"kind", "processor", "settings"}
    digest: bytes  # sha256 of ``text``


def fingerprint(kind: str, processor: str, settings: Mapping[str, object]) -> Fingerprint:
    """Canonical fingerprint of ``settings`` for media of ``kind`` fed to ``processor``.

    Args:
        kind: "image", "audio" or "video".
        processor: the processor class name (e.g. ``"Qwen2VLImageProcessorPil"``), or any stable label.
        settings: every setting that changes the model input: the decoder's options (``options.settings()``)
            and the processor's own (max_pixels, patch size, ...). Values: None, bool, int, float, str, or
            lists / tuples / mappings of those.

    Raises:
        TypeError: a value is of another type (a programming error, not a :class:`MediaError`).
        ValueError: a float is NaN or infinite.
    """
    doc = {"kind": str(kind), "processor": str(processor), "settings": _canonical(settings, "settings")}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return Fingerprint(text=text, digest=hashlib.sha256(text.encode("ascii")).digest())


def media_digest(data: bytes | bytearray | memoryview) -> MediaDigest:
    """sha256 of ``data``, the encoded bytes of one item (hex)."""
    return MediaDigest(hashlib.sha256(data).hexdigest())


def content_hash(data: bytes | bytearray | memoryview | MediaDigest, fp: Fingerprint) -> ContentHash:
    """The identity of ``data`` turned into model input as ``fp`` describes. Does not decode anything.

    ``data`` is the encoded bytes, or their :func:`media_digest` (a ``str``): the result is the same, and from the
    digest it costs nothing that grows with the item.

    Raises:
        ValueError: a digest that is not 64 hex digits (a programming error).
    """
    digest = data if isinstance(data, str) else media_digest(data)
    if len(digest) != 64:
        raise ValueError(f"a media digest is 64 hex digits, got {digest[:80]!r}")
    h = hashlib.sha256(_DOMAIN)
    h.update(fp.digest)
    h.update(bytes.fromhex(digest))
    return ContentHash(h.hexdigest())


def _canonical(value: object, path: str) -> object:
    if value is None or isinstance(value, bool | str):
        return str(value) if isinstance(value, enum.Enum) else value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: a fingerprint setting must be finite, got {value!r}")
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, Mapping):
        out = {}
        for key, sub in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: fingerprint setting names must be strings, got {key!r}")
            out[key] = _canonical(sub, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_canonical(sub, f"{path}[{i}]") for i, sub in enumerate(value)]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and type(value).__module__ == "numpy":
        return _canonical(item(), path)
    raise TypeError(f"{path}: cannot fingerprint a {type(value).__name__} ({value!r})")


# ---------------------------------------------------------------------------------------------------------------
# data: URLs
# ---------------------------------------------------------------------------------------------------------------

_MIME = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
_SPACES = (b" ", b"\t", b"\r", b"\n", b"\f", b"\v")


@dataclass(frozen=True, slots=True)
class DataURL:
    """A parsed ``data:<mime>[;params];base64,<payload>`` URL."""

    mime: str  # lowercased MIME type, e.g. "image/png"; "" when the URL names none
    params: tuple[tuple[str, str], ...]  # parameters between the type and ";base64", e.g. (("codecs", "opus"),)
    data: bytes  # the decoded payload


def parse_data_url(url: str, *, max_bytes: int | None = None, item: ItemRef = None, strict: bool = False) -> DataURL:
    """Parse a base64 ``data:`` URL. Never fetches anything.

    ``max_bytes`` is checked against the payload's length before the base64 is decoded; ``strict`` is passed on to
    :func:`decode_base64`.

    Raises:
        MediaURLError: ``url`` is not a string or not a ``data:`` URL (code ``remote_url`` for http(s), file and
            other schemes), has no ``;base64`` marker or a malformed MIME type (``invalid_url``), or its payload
            is not valid base64 (``invalid_base64``).
        MediaTooLargeError: the payload decodes to more than ``max_bytes`` (limit ``max_bytes``).
    """
    if not isinstance(url, str):
        raise MediaURLError(f"expected a data URL string, got {type(url).__name__}.", item=item)
    scheme = _SCHEME.match(url[:64])
    if scheme is None:
        raise MediaURLError("expected a 'data:' URL with base64 content.", item=item)
    if scheme.group(1).lower() != "data":
        raise MediaURLError(
            f"{scheme.group(1).lower()!r} URLs are not fetched; send the media inline as a base64 'data:' URL.",
            item=item,
            code="remote_url",
        )
    header, comma, payload = url[len("data:") :].partition(",")
    if not comma:
        raise MediaURLError("the data URL has no ',' before its content.", item=item)
    parts = [p.strip() for p in header.split(";")]
    if len(parts) < 2 or parts[-1].lower() != "base64":
        raise MediaURLError("only base64 data URLs are accepted ('data:<type>;base64,<content>').", item=item)
    mime = parts[0].lower()
    if mime and not _MIME.match(mime):
        raise MediaURLError(f"the data URL's media type {parts[0][:40]!r} is malformed.", item=item)
    params = []
    for raw in parts[1:-1]:
        key, eq, value = raw.partition("=")
        if not eq or not key.strip():
            raise MediaURLError(f"the data URL parameter {raw[:40]!r} is malformed.", item=item)
        params.append((key.strip().lower(), value.strip()))
    data = decode_base64(payload, max_bytes=max_bytes, item=item, strict=strict)
    return DataURL(mime=mime, params=tuple(params), data=data)


def decode_base64(
    payload: str | bytes, *, max_bytes: int | None = None, item: ItemRef = None, strict: bool = False
) -> bytes:
    """Decode standard base64, tolerating ASCII whitespace and missing ``=`` padding unless ``strict`` (the wire
    protocol's rule: the canonical alphabet, padded, nothing else).

    Raises:
        MediaURLError: characters outside the base64 alphabet, or a length no base64 text can have
            (code ``invalid_base64``).
        MediaTooLargeError: the result would exceed ``max_bytes`` (checked before decoding).
    """
    if isinstance(payload, str):
        try:
            raw = payload.encode("ascii")
        except UnicodeEncodeError:
            raise MediaURLError("the content is not valid base64.", item=item, code="invalid_base64") from None
    else:
        raw = bytes(payload)
    if not strict and any(space in raw for space in _SPACES):  # memchr scans; the copy is made only when needed
        raw = raw.translate(None, b"".join(_SPACES))
    _check_size(len(raw) * 3 // 4, max_bytes, item, slack=2, about="about ")
    try:
        if strict:  # refuses anything but the alphabet, padded to a multiple of four
            data = binascii.a2b_base64(raw, strict_mode=True)
        else:
            if len(raw) % 4 == 1:
                raise binascii.Error("no base64 text has this length")
            raw += b"=" * (-len(raw) % 4)  # tolerate missing padding
            data = base64.b64decode(raw, validate=True)  # refuses characters outside the alphabet, misplaced '='
    except (binascii.Error, ValueError):
        raise MediaURLError("the content is not valid base64.", item=item, code="invalid_base64") from None
    _check_size(len(data), max_bytes, item)
    return data


def _check_size(size: int, max_bytes: int | None, item: ItemRef, *, slack: int = 0, about: str = "") -> None:
    """Refuse ``size`` bytes (``slack`` more allowed, for an estimate from the base64 length) above ``max_bytes``."""
    if max_bytes is not None and size - slack > max_bytes:
        raise MediaTooLargeError(
            f"the media is {about}{size:,} bytes; the limit (max_bytes) is {max_bytes:,}.",
            limit="max_bytes",
            maximum=max_bytes,
            actual=size,
            item=item,
        )
