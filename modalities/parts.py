"""A media item as a request carries it, before anything is decoded."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MediaPart:
    """One media item of a message: its kind, its encoded bytes, the format the sender declared, and where it came
    from (``item``, e.g. ``"messages[1].content[0]"``, named by every error about it)."""

    kind: str  # "image" | "audio" | "video"
    data: bytes = field(repr=False)  # the encoded file
    declared: str | None  # the MIME type / format name the sender gave, or None to trust the bytes
    item: str  # where it came from, for errors
