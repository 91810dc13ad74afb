"""Media spans and the keys under which token positions are indexed.

A media item (image, audio clip, video) occupies a span of token positions ``[start, end)``. Two sequences may share
a prefix only where their media items are the same: same kind, same content hash, same span. The index enforces this
by replacing the tokens of every span with keys derived from the item:

- the first position of a span gets a *head key* derived from (kind, content hash, span length, token id), a
  negative integer below ``-2**32``;
- the other positions get ``-1 - token``, so they differ from every text token and every head key.

Equal keys up to a length ``n`` therefore mean equal items over every span that starts before ``n``, and whether ``n``
falls strictly inside a span is the same for both sequences. Head keys are 62-bit digests: the cache re-checks the
spans of the entry it picked exactly, so a digest collision can cost a hit but never give a wrong one.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cache.errors import SpanError, TokenError

MAX_TOKEN_ID = 2**31 - 1
_HEAD_KEY_BASE = 2**32
_HEAD_KEY_RANGE = 2**62 - 2**32


class MediaKind(enum.StrEnum):
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


@dataclass(frozen=True, slots=True, order=True)
class MediaSpan:
    """One media item and the token positions ``[start, end)`` it occupies."""

    start: int  # first token position of the item
    end: int  # one past its last token position
    kind: MediaKind  # image, audio or video
    content_hash: str  # what the item is (a modalities.identity.ContentHash); equal hashes mean equal model input

    def __post_init__(self) -> None:
        if not isinstance(self.start, int) or not isinstance(self.end, int):
            raise SpanError(f"span bounds must be integers, got [{self.start!r}, {self.end!r})")
        if self.start < 0 or self.end <= self.start:
            raise SpanError(f"span [{self.start}, {self.end}) is empty or negative")
        if not isinstance(self.kind, MediaKind):
            try:
                object.__setattr__(self, "kind", MediaKind(self.kind))
            except ValueError as exc:
                raise SpanError(f"unknown media kind {self.kind!r}") from exc
        if not isinstance(self.content_hash, str) or not self.content_hash:
            raise SpanError("a media span needs a non-empty content hash")


def check_tokens(tokens: Iterable[int]) -> list[int]:
    """Return ``tokens`` as a list of ints, or raise :class:`TokenError`."""
    out = list(tokens)
    if not out:
        raise TokenError("a token sequence must not be empty")
    for t in out:
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
            raise TokenError(f"token ids must be integers in [0, {MAX_TOKEN_ID}], got {t!r}")
    return out


def check_spans(spans: Iterable[MediaSpan], length: int) -> tuple[MediaSpan, ...]:
    """Return ``spans`` sorted by start, or raise :class:`SpanError` if any lies outside ``[0, length)``
    or two overlap."""
    ordered = sorted(spans)
    for span in ordered:
        if not isinstance(span, MediaSpan):
            raise SpanError(f"expected MediaSpan, got {type(span).__name__}")
        if span.end > length:
            raise SpanError(f"span [{span.start}, {span.end}) lies beyond the sequence length {length}")
    for before, after in itertools.pairwise(ordered):
        if after.start < before.end:
            raise SpanError(f"spans [{before.start}, {before.end}) and [{after.start}, {after.end}) overlap")
    return tuple(ordered)


def head_key(span: MediaSpan, token: int) -> int:
    """The key of a span's first position (see the module docstring)."""
    text = f"{span.kind.value}\0{span.content_hash}\0{span.end - span.start}\0{token}".encode()
    digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    return -(_HEAD_KEY_BASE + digest % _HEAD_KEY_RANGE)


def encode_keys(tokens: Sequence[int], spans: Sequence[MediaSpan]) -> array:
    """Index keys of a sequence: its tokens, with the positions of media spans replaced as described above."""
    keys = array("q", tokens)
    for span in spans:
        keys[span.start] = head_key(span, tokens[span.start])
        inner = keys[span.start + 1 : span.end]
        keys[span.start + 1 : span.end] = array("q", [-1 - t for t in inner])
    return keys


class SpanFloor:
    """Answers "the largest length <= n that does not fall strictly inside a span" for sorted spans."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, spans: Sequence[MediaSpan]) -> None:
        self._starts = [s.start for s in spans]  # span starts, ascending
        self._ends = [s.end for s in spans]  # matching span ends

    def __call__(self, n: int) -> int:
        i = bisect_right(self._starts, n - 1) - 1  # last span starting before n
        if i >= 0 and self._ends[i] > n:
            return self._starts[i]
        return n


def spans_before(spans: Sequence[MediaSpan], n: int) -> tuple[MediaSpan, ...]:
    """The spans that start before ``n`` (for a valid cut ``n`` they also end by ``n``)."""
    return tuple(s for s in spans if s.start < n)
