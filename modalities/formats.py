"""What the bytes are (magic-number sniffing) and what the sender said they are (MIME type or format name).

Containers are sniffed from their first bytes only; the decoders then get the sniffed container forced, so a file is
never handed to a demuxer chosen by FFmpeg's or libsndfile's own probing (which knows playlist formats that open
other URLs). The declared format, when there is one, must name the same container as the bytes; an empty or generic
type (``application/octet-stream``) counts as none.

Container names: ``jpeg png webp avif gif bmp tiff heif wav flac ogg mp3 aac isobmff ebml``. ISO BMFF covers
MP4 / M4A / MOV; EBML covers WebM / Matroska.
"""

from __future__ import annotations

from modalities.errors import CorruptMediaError, ItemRef, UnsupportedFormatError

# MIME types and bare format names (as in OpenAI's input_audio.format) -> container.
_DECLARED: dict[str, str] = {
    "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/pjpeg": "jpeg", "jpeg": "jpeg", "jpg": "jpeg",
    "image/png": "png", "png": "png",
    "image/webp": "webp", "webp": "webp",
    "image/avif": "avif", "avif": "avif",
    "image/gif": "gif", "gif": "gif",
    "image/bmp": "bmp", "bmp": "bmp",
    "image/tiff": "tiff", "tiff": "tiff",
    "image/heic": "heif", "image/heif": "heif", "heic": "heif",
    "audio/wav": "wav", "audio/wave": "wav", "audio/x-wav": "wav", "audio/vnd.wave": "wav", "wav": "wav",
    "audio/flac": "flac", "audio/x-flac": "flac", "flac": "flac",
    "audio/ogg": "ogg", "audio/opus": "ogg", "application/ogg": "ogg", "ogg": "ogg", "opus": "ogg", "oga": "ogg",
    "audio/mpeg": "mp3", "audio/mp3": "mp3", "mp3": "mp3",
    "audio/aac": "aac", "audio/x-aac": "aac", "aac": "aac",
    "audio/mp4": "isobmff", "audio/m4a": "isobmff", "audio/x-m4a": "isobmff", "m4a": "isobmff",
    "video/mp4": "isobmff", "video/quicktime": "isobmff", "mp4": "isobmff", "mov": "isobmff",
    "audio/webm": "ebml", "video/webm": "ebml", "webm": "ebml",
    "video/x-matroska": "ebml", "audio/x-matroska": "ebml", "mkv": "ebml",
}  # fmt: skip

_GENERIC = {"", "application/octet-stream", "binary/octet-stream"}  # treated as no declared type
_AVIF_BRANDS = {b"avif", b"avis"}
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}


def sniff(data: bytes) -> str | None:
    """The container the bytes start with, or None if it is not one we recognize."""
    head = bytes(data[:64])
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith((b"RIFF", b"RIFX")) and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith(b"BM"):
        return "bmp"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "tiff"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "ebml"
    if head[4:8] == b"ftyp":
        return _sniff_ftyp(data)
    if head.startswith(b"ID3"):
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        layer = (head[1] >> 1) & 0x3
        return "aac" if layer == 0 else "mp3"  # ADTS has layer bits 00; MPEG audio layers I-III do not
    return None


def _sniff_ftyp(data: bytes) -> str:
    """ISO BMFF: AVIF and HEIF images share the box structure with MP4; tell them apart by the ftyp brands."""
    size = int.from_bytes(data[0:4], "big")
    box = bytes(data[8 : min(max(size, 16), 256)])
    brands = {box[0:4]} | {box[i : i + 4] for i in range(8, len(box) - 3, 4)}
    if brands & _AVIF_BRANDS:
        return "avif"
    if box[0:4] in _HEIF_BRANDS:
        return "heif"
    return "isobmff"


def _undeclared(declared: str) -> bool:
    """An empty type (``data:;base64,...``) or a generic one says nothing about the format."""
    return declared.split(";", 1)[0].strip().lower() in _GENERIC


def normalize_declared(declared: str) -> str | None:
    """The container a MIME type or format name declares (``"image/JPEG; q=1"`` -> ``"jpeg"``), or None."""
    key = declared.split(";", 1)[0].strip().lower()
    return _DECLARED.get(key)


def identify(data: bytes, declared: str | None, accepted: frozenset[str], kind: str, item: ItemRef) -> str:
    """Sniff ``data``, check it against ``declared`` and ``accepted``, and return its container.

    Args:
        data: the raw bytes.
        declared: the MIME type or format name the sender gave, or None.
        accepted: the containers the caller can decode.
        kind: "image", "audio" or "video", for messages.
        item: the item's index or name, for errors.

    Raises:
        CorruptMediaError: ``data`` is empty.
        UnsupportedFormatError: the declared format is unknown or not accepted, the bytes are not a format we
            recognize or accept, or the declared format does not match the bytes (code ``format_mismatch``).
    """
    if len(data) == 0:
        raise CorruptMediaError(f"the {kind} is empty (zero bytes).", item=item, code="empty_media")
    wanted = None
    if declared is not None and not _undeclared(declared):
        wanted = normalize_declared(declared)
        if wanted is None or wanted not in accepted:
            raise UnsupportedFormatError(
                f"{declared!r} is not a supported {kind} format (supported: {_names(accepted)}).", item=item
            )
    found = sniff(data)
    if found is None:
        raise UnsupportedFormatError(
            f"the data is not a recognized {kind} format (supported: {_names(accepted)}).", item=item
        )
    if wanted is not None and found != wanted:
        raise UnsupportedFormatError(
            f"the data was declared as {declared!r} but is {_label(found)}.", item=item, code="format_mismatch"
        )
    if found not in accepted:
        raise UnsupportedFormatError(
            f"{_label(found)} is not a supported {kind} format (supported: {_names(accepted)}).", item=item
        )
    return found


_LABELS = {"isobmff": "MP4/M4A/MOV", "ebml": "WebM/Matroska", "heif": "HEIF/HEIC"}


def _label(container: str) -> str:
    return _LABELS.get(container, container.upper())


def _names(accepted: frozenset[str]) -> str:
    return ", ".join(sorted(_label(c) for c in accepted))
