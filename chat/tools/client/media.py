"""Media inputs -> OpenAI-style content parts, as the protocol wants them (docs/protocol.md, "Message content").

Pure functions, no I/O besides reading the files you name::

    image_part(Path("cat.png"))            {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
    image_part(pil_image)                  the image encoded as PNG
    audio_part(samples, sample_rate=16000) {"type": "input_audio", "input_audio": {"data": "...", "format": "wav"}}
    audio_part(Path("clip.flac"))          the file's bytes, format from the bytes (else from the suffix)
    video_part(b"...mp4 bytes...")         {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}

:func:`to_content` builds a whole message: a ``str`` stays a string; a list (or several arguments to the client's
``send``) becomes parts, where each item is one of

- ``str``: a text part (a string is never read as a file path: pass a :class:`pathlib.Path` for that);
- ``dict``: an already wire-shaped part, passed through unchanged;
- :class:`Image`, :class:`Audio`, :class:`Video`: an explicit media item (needed for raw audio samples, or to force
  the kind of ambiguous bytes);
- a PIL image: an image part (PNG);
- a :class:`pathlib.Path` (or any ``os.PathLike``): the kind comes from the suffix (``.png`` ... image, ``.wav`` ...
  audio, ``.mp4`` ... video), then from the file's first bytes;
- ``bytes``: the kind and format come from the first bytes, read by the server's own sniffer
  (:func:`modalities.formats.sniff`: PNG, JPEG, GIF, WebP, BMP, TIFF, AVIF, HEIF; WAV, FLAC, Ogg, MP3; MP4, WebM).
  ISO BMFF (MP4 / M4A) and EBML (WebM / Matroska) bytes are taken as video unless wrapped in :class:`Audio`.

Audio samples (a numpy array, ``[frames]`` or ``[frames, channels]``, float in [-1, 1] or integer PCM) are encoded as
16-bit PCM WAV with soundfile. Pillow, numpy and soundfile are imported only when such values are given.

Raises :class:`~chat.tools.client.errors.MediaEncodingError` for anything it cannot encode; the server still checks
that the bytes decode (``invalid_media``).
"""

from __future__ import annotations

import base64
import io
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chat.tools.client.errors import MediaEncodingError
from modalities.formats import sniff

Part = dict[str, Any]
Source = str | os.PathLike[str] | bytes | bytearray | memoryview | Any  # Any: PIL images, numpy arrays

IMAGE_SUFFIXES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
    ".avif": "image/avif",
    ".heic": "image/heic",
    ".heif": "image/heif",
}
AUDIO_SUFFIXES = {
    ".wav": "wav",
    ".mp3": "mp3",
    ".flac": "flac",
    ".ogg": "ogg",
    ".oga": "ogg",
    ".opus": "opus",
    ".m4a": "m4a",
    ".weba": "webm",
}
VIDEO_SUFFIXES = {
    ".mp4": "video/mp4",
    ".m4v": "video/mp4",
    ".mov": "video/quicktime",
    ".webm": "video/webm",
    ".mkv": "video/x-matroska",
}


@dataclass(frozen=True, slots=True)
class Image:
    """An image: a path, encoded bytes, or a PIL image (sent as PNG)."""

    source: Source
    mime: str | None = None  # e.g. "image/jpeg"; None: from the bytes, else the suffix


@dataclass(frozen=True, slots=True)
class Audio:
    """Audio: a path, encoded bytes, or a numpy array of samples with its ``sample_rate`` (sent as WAV)."""

    source: Source
    sample_rate: int | None = None  # required for arrays, ignored otherwise
    format: str | None = None  # "wav", "mp3", "flac", "ogg", "opus", "webm", "m4a"; None: from the bytes / suffix


@dataclass(frozen=True, slots=True)
class Video:
    """A video: a path or encoded bytes (MP4, WebM, MOV, Matroska)."""

    source: Source
    mime: str | None = None  # e.g. "video/webm"; None: from the bytes, else the suffix


def text_part(text: str) -> Part:
    return {"type": "text", "text": text}


def image_part(source: Source, *, mime: str | None = None) -> Part:
    """An ``image_url`` part holding the image as a data URL."""
    pil = _pil_image_class()
    if pil is not None and isinstance(source, pil):
        data, mime = _png_bytes(source), "image/png"
    else:
        data, suffix = _read(source, "image")
        mime = mime or _IMAGE_MIME.get(sniff(data) or "") or IMAGE_SUFFIXES.get(suffix)
        if mime is None:
            raise MediaEncodingError(f"cannot tell the image format of {_describe(source)}; pass mime=")
    return {"type": "image_url", "image_url": {"url": _data_url(mime, data)}}


def audio_part(source: Source, *, sample_rate: int | None = None, format: str | None = None) -> Part:
    """An ``input_audio`` part: the file's bytes, or samples encoded as 16-bit WAV (``sample_rate`` required)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(source, np.ndarray):
        data, format = _wav_bytes(source, sample_rate), "wav"
    else:
        data, suffix = _read(source, "audio")
        format = format or _AUDIO_FORMAT.get(sniff(data) or "") or AUDIO_SUFFIXES.get(suffix)
        if format is None:
            raise MediaEncodingError(f"cannot tell the audio format of {_describe(source)}; pass format=")
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode("ascii"), "format": format}}


def video_part(source: Source, *, mime: str | None = None) -> Part:
    """A ``video_url`` part holding the video as a data URL."""
    data, suffix = _read(source, "video")
    mime = mime or VIDEO_SUFFIXES.get(suffix) or _VIDEO_MIME.get(sniff(data) or "")
    if mime is None:
        raise MediaEncodingError(f"cannot tell the video format of {_describe(source)}; pass mime=")
    return {"type": "video_url", "video_url": {"url": _data_url(mime, data)}}


def media_part(item: Any) -> Part:
    """One content part for ``item`` (see the module docstring for what each type becomes)."""
    if isinstance(item, str):
        return text_part(item)
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, Image):
        return image_part(item.source, mime=item.mime)
    if isinstance(item, Audio):
        return audio_part(item.source, sample_rate=item.sample_rate, format=item.format)
    if isinstance(item, Video):
        return video_part(item.source, mime=item.mime)
    pil = _pil_image_class()
    if pil is not None and isinstance(item, pil):
        return image_part(item)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(item, np.ndarray):
        raise MediaEncodingError("wrap audio samples as Audio(array, sample_rate=...)")
    if isinstance(item, os.PathLike):
        return _path_part(Path(item))
    if isinstance(item, bytes | bytearray | memoryview):
        return _bytes_part(bytes(item))
    raise MediaEncodingError(f"cannot send a {type(item).__name__} as message content")


def to_content(content: Any) -> str | list[Part]:
    """Message content for the wire: a ``str`` as is, anything else as a list of parts (one per item)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        if not content:
            raise MediaEncodingError("the message content is empty")
        return [media_part(item) for item in content]
    return [media_part(content)]


# ---------------------------------------------------------------- internals

_IMAGE_MIME = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "bmp": "image/bmp",
    "tiff": "image/tiff",
    "avif": "image/avif",
    "heif": "image/heif",
}  # containers modalities.formats.sniff names -> the data URL's type
_AUDIO_FORMAT = {"wav": "wav", "flac": "flac", "ogg": "ogg", "mp3": "mp3"}
_VIDEO_MIME = {"isobmff": "video/mp4", "ebml": "video/webm"}
_PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}


def _read(source: Source, kind: str) -> tuple[bytes, str]:
    """The bytes of ``source`` and its lower-case suffix ('' for bytes)."""
    if isinstance(source, bytes | bytearray | memoryview):
        data, suffix = bytes(source), ""
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise MediaEncodingError(f"cannot read the {kind} file {path}: {exc.strerror or exc}") from exc
        suffix = path.suffix.lower()
    else:
        raise MediaEncodingError(f"cannot send a {type(source).__name__} as {kind}")
    if not data:
        raise MediaEncodingError(f"the {kind} {_describe(source)} is empty")
    return data, suffix


def _path_part(path: Path) -> Part:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return image_part(path)
    if suffix in AUDIO_SUFFIXES:
        return audio_part(path)
    if suffix in VIDEO_SUFFIXES:
        return video_part(path)
    data, _ = _read(path, "media")
    return _bytes_part(data, path)


def _bytes_part(data: bytes, origin: Path | None = None) -> Part:
    found = sniff(data)
    if found in _IMAGE_MIME:
        return image_part(data, mime=_IMAGE_MIME[found])
    if found in _AUDIO_FORMAT:
        return audio_part(data, format=_AUDIO_FORMAT[found])
    if found in _VIDEO_MIME:
        return video_part(data, mime=_VIDEO_MIME[found])
    what = str(origin) if origin is not None else f"{len(data)} bytes"
    raise MediaEncodingError(f"{what}: not a recognized image, audio or video format; wrap it in Image/Audio/Video")


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _describe(source: Source) -> str:
    if isinstance(source, bytes | bytearray | memoryview):
        return f"({len(source)} bytes)"
    return str(source)


def _pil_image_class() -> type | None:
    module = sys.modules.get("PIL.Image")  # a PIL image can only exist if Pillow is imported
    return None if module is None else module.Image


def _png_bytes(image: Any) -> bytes:
    if image.mode not in _PNG_MODES:
        image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _wav_bytes(samples: Any, sample_rate: int | None) -> bytes:
    import numpy as np
    import soundfile

    if not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise MediaEncodingError(f"audio samples need a positive integer sample_rate, got {sample_rate!r}")
    if samples.ndim not in (1, 2) or samples.shape[0] == 0 or samples.size == 0:
        raise MediaEncodingError(f"audio samples must be [frames] or [frames, channels], got shape {samples.shape}")
    if samples.dtype.kind == "f":
        if not np.isfinite(samples).all():
            raise MediaEncodingError("audio samples hold NaN or infinity")
        samples = np.clip(samples, -1.0, 1.0)
    elif samples.dtype.kind not in "iu":
        raise MediaEncodingError(f"audio samples must be float or integer, got {samples.dtype}")
    if samples.dtype.kind == "u":  # unsigned PCM is centred on half its range
        samples = samples.astype(np.float64) / (np.iinfo(samples.dtype).max / 2) - 1.0
    elif samples.dtype.kind == "i" and samples.dtype not in (np.int16, np.int32):
        samples = samples.astype(np.float64) / -np.iinfo(samples.dtype).min
    out = io.BytesIO()
    soundfile.write(out, samples, sample_rate, format="WAV", subtype="PCM_16")
    return out.getvalue()
