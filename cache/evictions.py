"""What eviction took: a bounded record of the key prefixes of recently evicted entries, per namespace, so that a
lookup that stops early can tell whether the namespace held a longer match that was evicted (the ``evicted`` reason
a turn reports). Nothing here holds state tensors or token ids: only digests of key prefixes.

An evicted entry is recorded as the chained digests of its keys at every :data:`BLOCK` boundary: digest ``i``
stands for ``keys[:(i + 1) * BLOCK]`` (and so for every digest before it). :meth:`EvictionRecord.reach` is then how
many whole blocks of a query some recorded entry began with. The record holds at most ``capacity`` digests; the
oldest evicted entries are forgotten first. Per namespace, so one tenant's evictions never answer another's query.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable

BLOCK = 16  # keys per digest: reach is reported in whole blocks
CAPACITY = 8192  # digests held (8,192 x 16 keys: the prefixes of about 131k evicted positions)


def prefix_digests(keys: array, block: int = BLOCK) -> list[bytes]:
    """The chained digests of ``keys`` at every whole ``block``: item ``i`` identifies ``keys[:(i + 1) * block]``."""
    out: list[bytes] = []
    previous = b""
    for start in range(0, len(keys) - block + 1, block):
        previous = hashlib.blake2b(previous + keys[start : start + block].tobytes(), digest_size=8).digest()
        out.append(previous)
    return out


class EvictionRecord:
    """The key prefixes of the entries evicted most recently, by namespace. Not thread-safe (the cache's lock)."""

    def __init__(self, capacity: int = CAPACITY, block: int = BLOCK) -> None:
        if capacity < 1 or block < 1:
            raise ValueError("capacity and block must be positive")
        self.capacity = capacity  # most digests held
        self.block = block  # keys per digest
        self._order: OrderedDict[int, tuple[Hashable, list[bytes]]] = OrderedDict()  # oldest first
        self._counts: dict[tuple[Hashable, bytes], int] = {}  # (namespace, digest) -> entries recorded with it
        self._held = 0  # digests in _order
        self._next = 0  # the next record's number

    def __len__(self) -> int:
        """Evicted entries remembered."""
        return len(self._order)

    def record(self, namespace: Hashable, keys: array) -> None:
        """Remember that an entry of ``namespace`` with index keys ``keys`` was evicted (shorter than a block:
        nothing to remember). The oldest records are forgotten beyond ``capacity`` digests."""
        digests = prefix_digests(keys[: self.capacity * self.block], self.block)  # at most the first `capacity`
        if not digests:
            return
        self._order[self._next] = (namespace, digests)
        self._next += 1
        self._held += len(digests)
        for d in digests:
            self._counts[(namespace, d)] = self._counts.get((namespace, d), 0) + 1
        while self._held > self.capacity:
            self._forget_oldest()

    def reach(self, namespace: Hashable, keys: array) -> int:
        """How many keys of ``keys`` (whole blocks) some remembered evicted entry of ``namespace`` began with."""
        if not self._counts:
            return 0
        reached = 0
        previous = b""
        for start in range(0, len(keys) - self.block + 1, self.block):
            previous = hashlib.blake2b(previous + keys[start : start + self.block].tobytes(), digest_size=8).digest()
            if (namespace, previous) not in self._counts:
                break
            reached = start + self.block
        return reached

    def check(self) -> None:
        """Assert the record's invariants (tests)."""
        assert self._held == sum(len(d) for _, d in self._order.values()) <= self.capacity
        counts: dict[tuple[Hashable, bytes], int] = {}
        for ns, digests in self._order.values():
            for d in digests:
                counts[(ns, d)] = counts.get((ns, d), 0) + 1
        assert counts == self._counts

    def _forget_oldest(self) -> None:
        self._remove(next(iter(self._order)))

    def _remove(self, number: int) -> None:
        namespace, digests = self._order.pop(number)
        self._held -= len(digests)
        for d in digests:
            key = (namespace, d)
            self._counts[key] -= 1
            if not self._counts[key]:
                del self._counts[key]
