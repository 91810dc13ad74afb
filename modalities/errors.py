"""Errors raised by :mod:`modalities` for bad media.

Every error about the media a user sent derives from :class:`MediaError`. Each one names the item it concerns
(``item``: its index in the request, or a name) and carries a stable machine-readable ``code``; its message is
written for the end user who sent the media::

    MediaError                   .item, .code
    ├── MediaURLError            not a base64 data URL: malformed, bad base64, or a remote URL (never fetched)
    │                            codes: invalid_url, invalid_base64, remote_url
    ├── CorruptMediaError        zero-length, truncated or corrupt data
    │                            codes: empty_media, corrupt_media
    ├── UnsupportedFormatError   unknown or unsupported format or codec, no usable stream, or a declared format
    │                            that does not match the bytes
    │                            codes: unsupported_format, unsupported_codec, format_mismatch, no_stream
    └── MediaTooLargeError       a limit was exceeded: .limit names it, .maximum is its value, .actual what was
                                 found (None when only known to be above the limit)
                                 code: media_too_large

Programming errors (a negative limit, a setting that cannot be fingerprinted) raise ``ValueError`` / ``TypeError``
as usual, not :class:`MediaError`.
"""

from __future__ import annotations

ItemRef = int | str | None
"""Which media item an error concerns: its index in the request, a name, or None when unknown."""


def describe_item(item: ItemRef) -> str:
    """How messages refer to an item: ``media item 2``, ``media item 'cat.png'``, or ``""`` when unknown."""
    if item is None:
        return ""
    if isinstance(item, int):
        return f"media item {item}"
    return f"media item {item!r}"


def _message(item: ItemRef, detail: str) -> str:
    where = describe_item(item)
    return f"{where}: {detail}" if where else detail[:1].upper() + detail[1:]


class MediaError(ValueError):
    """Base class of every error :mod:`modalities` raises about the media it was given."""

    default_code = "media_error"

    def __init__(self, detail: str, *, item: ItemRef = None, code: str | None = None) -> None:
        self.item = item  # index or name of the media item concerned, or None
        self.code = code or self.default_code  # stable machine-readable reason
        self.detail = detail  # the message without the item prefix
        super().__init__(_message(item, detail))

    def for_item(self, item: ItemRef) -> MediaError:
        """Return a copy of this error naming ``item`` (for callers that learn the index later)."""
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.item = item
        clone.args = (_message(item, self.detail),)
        clone.__cause__ = self.__cause__
        return clone


class MediaURLError(MediaError):
    """The media reference is not a well-formed base64 ``data:`` URL (remote URLs are refused, never fetched)."""

    default_code = "invalid_url"


class CorruptMediaError(MediaError):
    """The data is empty, truncated or corrupt."""

    default_code = "corrupt_media"


class UnsupportedFormatError(MediaError):
    """The format or codec is unknown or not supported, or the declared format does not match the bytes."""

    default_code = "unsupported_format"


class MediaTooLargeError(MediaError):
    """A limit was exceeded (bytes, pixels, seconds, frames, ...)."""

    default_code = "media_too_large"

    def __init__(
        self,
        detail: str,
        *,
        limit: str,
        maximum: float,
        actual: float | None = None,
        item: ItemRef = None,
    ) -> None:
        self.limit = limit  # name of the limit, e.g. "max_pixels" (a field of the limits dataclass)
        self.maximum = maximum  # the limit's value
        self.actual = actual  # what the media has or claims, or None if only known to exceed the limit
        super().__init__(detail, item=item)
