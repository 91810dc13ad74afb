"""A content-addressed, byte-budgeted LRU store of what media turned into, so a repeat is neither decoded nor encoded
again.

Keys are ``(content_hash, stage)``. The content hash already names the bytes *and* the settings that turn them into
model input (see :mod:`modalities.identity`); the stage says which product is stored: ``"decoded"`` (the default,
a :class:`~modalities.image.DecodedImage` / ``DecodedAudio`` / ``DecodedVideo``) or anything a caller chooses, such
as ``"encoded:<model fingerprint>"`` for a vision tower's output. Values are arbitrary objects with a declared size
in bytes (``nbytes`` by default).

Ordering rule: every hit and every store moves the key to the most-recently-used end; when a store would exceed the
budget, keys are evicted from the least-recently-used end until it fits. A value larger than the whole budget is
returned but not stored. Nothing is stored or evicted until a decode has succeeded, so a decode that raises leaves
the store exactly as it was.

Thread safety: all operations take one lock; ``decode_fn`` runs outside it, so two threads missing on the same key
at the same time may both decode (the first result stored wins and both callers get it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from modalities.identity import ContentHash

T = TypeVar("T")
DECODED = "decoded"  # the default stage
Key = tuple[ContentHash, str]  # (content hash, stage)


@dataclass(frozen=True, slots=True)
class StoreStats:
    entries: int  # values held
    bytes: int  # sum of their declared sizes
    budget: int  # the byte budget
    hits: int  # lookups that found a value
    misses: int  # lookups that did not
    evictions: int  # values dropped to make room
    oversize: int  # values not stored because they alone exceed the budget


class MediaStore:
    """See the module docstring. ``budget_bytes`` bounds the sum of the declared sizes of the stored values."""

    def __init__(self, budget_bytes: int) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be a non-negative integer, got {budget_bytes!r}")
        self._budget = budget_bytes  # upper bound on self._bytes
        self._entries: OrderedDict[Key, tuple[Any, int]] = OrderedDict()  # key -> (value, size); LRU first
        self._bytes = 0  # sum of the sizes in self._entries
        self._lock = threading.Lock()  # guards every field below and above
        self._hits = 0  # counters reported by stats()
        self._misses = 0
        self._evictions = 0
        self._oversize = 0

    # ---- public API -------------------------------------------------------------------------------------------

    def get(self, content_hash: ContentHash, stage: str = DECODED, default: Any = None) -> Any:
        """The value stored under ``(content_hash, stage)``, marking it most recently used; ``default`` if absent."""
        with self._lock:
            return self._lookup((content_hash, stage), default)

    def put(self, content_hash: ContentHash, value: Any, size: int, stage: str = DECODED) -> bool:
        """Store ``value`` (declared ``size`` bytes), evicting least recently used values to fit.

        Returns False, storing nothing and evicting nothing, if ``size`` alone exceeds the budget. Replaces any value
        already under the key.

        Raises:
            ValueError: ``size`` is not a non-negative integer.
        """
        _check_size(size)
        with self._lock:
            return self._store((content_hash, stage), value, size)

    def get_or_decode(
        self,
        content_hash: ContentHash,
        decode_fn: Callable[[], T],
        *,
        stage: str = DECODED,
        size_of: Callable[[T], int] | None = None,
    ) -> T:
        """The stored value, or ``decode_fn()`` stored and returned.

        ``size_of(value)`` gives the size to charge (default: ``value.nbytes``). If ``decode_fn`` or ``size_of``
        raises, the exception propagates and the store is unchanged (apart from the miss counter).

        Raises:
            Whatever ``decode_fn`` raises (typically a :class:`~modalities.errors.MediaError`).
            ValueError: the size is not a non-negative integer.
            AttributeError: no ``size_of`` and the value has no ``nbytes``.
        """
        key = (content_hash, stage)
        missing = object()
        with self._lock:
            found = self._lookup(key, missing)
        if found is not missing:
            return found
        value = decode_fn()
        size = size_of(value) if size_of is not None else value.nbytes  # type: ignore[attr-defined]
        _check_size(size)
        with self._lock:
            if key in self._entries:  # another thread stored it meanwhile: keep one copy
                self._entries.move_to_end(key)
                return self._entries[key][0]
            self._store(key, value, size)
        return value

    def peek(self, content_hash: ContentHash, stage: str = DECODED, default: Any = None) -> Any:
        """The value stored under the key, or ``default``; unlike :meth:`get` it neither marks the value as used nor
        counts a hit or a miss (for reports on what is held)."""
        with self._lock:
            entry = self._entries.get((content_hash, stage))
            return default if entry is None else entry[0]

    def contains(self, content_hash: ContentHash, stage: str = DECODED) -> bool:
        """Whether a value is stored under the key (does not touch it or count a hit)."""
        with self._lock:
            return (content_hash, stage) in self._entries

    def discard(self, content_hash: ContentHash, stage: str | None = None) -> int:
        """Drop the value under ``(content_hash, stage)``, or every stage's value if ``stage`` is None.
        Returns how many values were dropped."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == content_hash and (stage is None or k[1] == stage)]
            for key in keys:
                self._bytes -= self._entries.pop(key)[1]
            return len(keys)

    def lru_keys(self) -> list[Key]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._entries)

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                entries=len(self._entries),
                bytes=self._bytes,
                budget=self._budget,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                oversize=self._oversize,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # ---- private helpers (caller holds the lock) --------------------------------------------------------------

    def _lookup(self, key: Key, default: Any) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            self._misses += 1
            return default
        self._hits += 1
        self._entries.move_to_end(key)
        return entry[0]

    def _store(self, key: Key, value: Any, size: int) -> bool:
        if size > self._budget:
            self._oversize += 1
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        while self._bytes + size > self._budget:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
            self._evictions += 1
        self._entries[key] = (value, size)
        self._bytes += size
        return True


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"a stored value's size must be a non-negative integer, got {size!r}")
