"""Pins: prefixes held in the cache for a time after their last use (prompt-caching breakpoints that hold).

A *pin* names a prefix (a namespace and the index keys of its first ``length`` positions) and lasts ``ttl`` seconds
after its last use. It lives on one entry, its *holder*, which serves the prefix at exactly ``length``; the cache
treats a holder as it treats an entry in use (see :class:`cache.PrefixCache`). This module is the bookkeeping only:
which pins exist, which entry holds each, when each expires. It knows nothing of tensors or budgets.

Time is whatever the cache's clock says (seconds, monotonic): tests give a clock they step by hand.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from array import array
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from cache.radix import EntryId

PinKey = tuple[Hashable, bytes]  # (namespace, digest of the prefix's index keys)


def prefix_digest(keys: array) -> bytes:
    """Identifies a prefix by its index keys (tokens, media re-keyed): 16 bytes of blake2b."""
    return hashlib.blake2b(keys.tobytes(), digest_size=16).digest()


@dataclass(slots=True, eq=False)
class Pin:
    key: PinKey  # (namespace, prefix digest): pinning the same prefix again refreshes this pin
    length: int  # tokens of the prefix
    ttl: float  # seconds it lasts after its last use
    expires: float  # clock time it lapses at
    holder: EntryId  # the entry that serves it (moves to the entry that supersedes it)
    number: int  # creation order (expiries at the same time go in this order)


class PinTable:
    """Every live pin, by key and by holder, and their expiries. Not thread-safe (the cache's caller serialises)."""

    def __init__(self) -> None:
        self._by_key: dict[PinKey, Pin] = {}
        self._by_holder: dict[EntryId, dict[PinKey, Pin]] = {}
        self._heap: list[tuple[float, int, Pin]] = []  # (expires, number, pin); stale items are skipped
        self._numbers = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[Pin]:
        return iter(self._by_key.values())

    def get(self, key: PinKey) -> Pin | None:
        return self._by_key.get(key)

    def held_by(self, eid: EntryId) -> list[Pin]:
        """The pins entry ``eid`` holds (oldest first)."""
        return list(self._by_holder.get(eid, {}).values())

    def holds(self, eid: EntryId) -> int:
        """How many pins entry ``eid`` holds."""
        return len(self._by_holder.get(eid, ()))

    def holders(self) -> set[EntryId]:
        return set(self._by_holder)

    def add(self, key: PinKey, length: int, ttl: float, now: float, holder: EntryId) -> Pin:
        assert key not in self._by_key
        pin = Pin(key, length, ttl, now + ttl, holder, next(self._numbers))
        self._by_key[key] = pin
        self._by_holder.setdefault(holder, {})[key] = pin
        heapq.heappush(self._heap, (pin.expires, pin.number, pin))
        return pin

    def refresh(self, pin: Pin, now: float, ttl: float | None = None) -> None:
        """Used now: it lasts ``ttl`` (default: its own) from now, or until its current expiry if that is later; a
        longer ``ttl`` becomes its own."""
        if ttl is not None and ttl > pin.ttl:
            pin.ttl = ttl
        expires = now + pin.ttl
        if expires > pin.expires:
            pin.expires = expires
            heapq.heappush(self._heap, (pin.expires, pin.number, pin))

    def move(self, source: EntryId, target: EntryId) -> int:
        """Hand every pin of ``source`` to ``target``. Returns how many moved."""
        pins = self._by_holder.pop(source, {})
        if pins:
            held = self._by_holder.setdefault(target, {})
            for key, pin in pins.items():
                pin.holder = target
                held[key] = pin
        return len(pins)

    def due(self, now: float) -> list[Pin]:
        """Remove and return the pins whose expiry is ``<= now``, in expiry order (then creation order)."""
        out: list[Pin] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            expires, _, pin = heapq.heappop(heap)
            if pin.expires != expires or self._by_key.get(pin.key) is not pin:
                continue  # refreshed since, or gone
            self._remove(pin)
            out.append(pin)
        return out

    def check(self) -> None:
        """Assert the table's invariants (tests)."""
        by_holder = {(pin.holder, key) for key, pin in self._by_key.items()}
        assert by_holder == {(eid, key) for eid, pins in self._by_holder.items() for key in pins}
        assert all(pins for pins in self._by_holder.values()), "an empty holder set was kept"
        live = {(pin.expires, pin.number) for pin in self._by_key.values()}
        assert live <= {(e, n) for e, n, _ in self._heap}, "a live pin's expiry is not in the heap"

    def _remove(self, pin: Pin) -> None:
        del self._by_key[pin.key]
        held = self._by_holder[pin.holder]
        del held[pin.key]
        if not held:
            del self._by_holder[pin.holder]
