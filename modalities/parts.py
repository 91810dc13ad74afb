"""One media item of a request, before anything is decoded: :class:`MediaInput`.

An item carries the sha256 of its encoded bytes (:func:`modalities.identity.media_digest`), computed once when the
item was first read, and the bytes themselves, or the base64 text they arrived in, decoded only when a decoder needs
them. A conversation's earlier items are therefore found by digest (a media store keyed by content hash) and neither
hashed nor decoded again in later turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modalities import identity
from modalities.identity import MediaDigest


@dataclass(frozen=True, slots=True)
class Base64Text:
    """Encoded bytes kept as the valid base64 they arrived in: ``text[start:]`` (no copy is made to keep them)."""

    text: str = field(repr=False)  # e.g. a whole data URL
    start: int  # where the base64 begins in `text`

    def decode(self) -> bytes:
        """The bytes. The text was validated when the item was made, so this does not fail on valid input.

        Raises:
            MediaURLError: the text is not strict base64 (a caller that skipped validation).
        """
        return identity.decode_base64(self.text[self.start :], strict=True)


@dataclass(frozen=True, slots=True, eq=False)
class MediaInput:
    """One media item of a message: its kind, the digest and source of its encoded bytes, the format the sender
    declared, and where it came from (``item``, e.g. ``"messages[1].content[0]"``, named by every error about it).

    Make one with :meth:`from_bytes`, or with ``digest`` and a :class:`Base64Text` when the digest is known already.
    """

    kind: str  # "image" | "audio" | "video"
    digest: MediaDigest  # sha256 of the encoded bytes
    source: bytes | Base64Text = field(repr=False)  # the encoded bytes, or the base64 they are decoded from
    declared: str | None = None  # the MIME type / format name the sender gave, or None to trust the bytes
    item: str = "media"  # where it came from, for errors

    @classmethod
    def from_bytes(cls, kind: str, data: bytes, declared: str | None = None, item: str = "media") -> MediaInput:
        """An item holding ``data``; hashes it (once)."""
        return cls(kind, identity.media_digest(data), bytes(data), declared, item)

    @property
    def data(self) -> bytes:
        """The encoded bytes (decoded from base64 on each call when not held: call it only to decode the item)."""
        return self.source if isinstance(self.source, bytes) else self.source.decode()
