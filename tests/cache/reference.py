"""A deliberately simple model of the prefix cache: a linear scan over every entry, each rule applied literally.

It shares no code with :mod:`cache` beyond the value types, so the property tests compare two independent readings
of the same rules. Sizes are counted per entry (the tests never share tensors between entries).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cache.media import MediaSpan
from cache.namespace import Namespace


@dataclass
class RefEntry:
    eid: int
    namespace: Namespace
    tokens: list[int]
    media: tuple[MediaSpan, ...]
    lo: int  # shortest length every rotating layer can serve (0 without rotating layers)
    points: frozenset[int] | None  # snapshot lengths common to all recurrent layers; None without any
    nbytes: int
    recency: int
    tier: str = "device"
    users: int = 0
    superseded: bool = False

    def inside_span(self, n: int) -> bool:
        return any(s.start < n < s.end for s in self.media)

    def servable(self) -> set[int]:
        candidates = set(range(max(self.lo, 1), len(self.tokens) + 1))
        if self.points is not None:
            candidates &= self.points
        return {n for n in candidates if not self.inside_span(n)}


def spans_before(spans, n):
    return tuple(s for s in sorted(spans) if s.start < n)


def shares_prefix(longer_tokens, longer_media, shorter_tokens, shorter_media) -> bool:
    """Whether (shorter) is a prefix of (longer), media included: equal tokens, equal spans starting before its end."""
    n = len(shorter_tokens)
    if len(longer_tokens) < n or list(longer_tokens[:n]) != list(shorter_tokens):
        return False
    return spans_before(longer_media, n) == tuple(sorted(shorter_media))


@dataclass
class ReferenceCache:
    device_budget: int | None = None
    host_budget: int | None = 0
    entries: dict[int, RefEntry] = field(default_factory=dict)
    clock: int = 0
    counters: dict[str, int] = field(default_factory=lambda: {"offloads": 0, "evictions": 0, "superseded": 0})

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def lru(self) -> list[int]:
        return [e.eid for e in sorted(self.entries.values(), key=lambda e: e.recency)]

    # -- the rules

    def lookup(self, namespace, tokens, media) -> tuple[int, int] | None:
        """(length, entry) of the best prefix, touching the entry; None on a miss."""
        limit = len(tokens) - 1
        query_spans = tuple(sorted(media))
        best: tuple[int, int, int] | None = None  # (length, recency, eid)
        for e in self.entries.values():
            if e.namespace != namespace:
                continue
            shared = 0
            for a, b in zip(e.tokens, tokens, strict=False):
                if a != b:
                    break
                shared += 1
            servable = e.servable()
            for n in range(min(shared, limit), 0, -1):
                if n not in servable or any(s.start < n < s.end for s in query_spans):
                    continue
                if spans_before(e.media, n) != spans_before(query_spans, n):
                    continue
                if best is None or (n, e.recency) > best[:2]:
                    best = (n, e.recency, e.eid)
                break
        if best is None:
            return None
        self.entries[best[2]].recency = self._tick()
        return best[0], best[2]

    def insert(self, eid: int, namespace, tokens, media, lo, points, nbytes) -> tuple[int, bool]:
        """Apply an insert; ``eid`` is the id the real cache returned. Returns (the serving entry, whether a new
        entry was added)."""
        points = None if points is None else frozenset(points)
        new = RefEntry(eid, namespace, list(tokens), tuple(sorted(media)), lo, points, nbytes, 0)
        mine = new.servable()
        covering = [
            e
            for e in self.entries.values()
            if e.namespace == namespace
            and shares_prefix(e.tokens, e.media, new.tokens, new.media)
            and mine <= e.servable()
        ]
        if covering:
            best = max(covering, key=lambda e: e.recency)
            best.recency = self._tick()
            return best.eid, False
        new.recency = self._tick()
        self.entries[eid] = new
        for e in list(self.entries.values()):
            if e.eid == eid or e.namespace != namespace:
                continue
            if shares_prefix(new.tokens, new.media, e.tokens, e.media) and e.servable() <= mine:
                if e.users:
                    e.superseded = True
                else:
                    del self.entries[e.eid]
                    self.counters["superseded"] += 1
        self.enforce()
        return eid, True

    def acquire(self, eid: int) -> None:
        e = self.entries[eid]
        e.tier = "device"
        e.users += 1
        e.recency = self._tick()
        self.enforce()

    def release(self, eid: int) -> None:
        e = self.entries[eid]
        e.users -= 1
        if e.superseded and not e.users:
            del self.entries[eid]
            self.counters["superseded"] += 1
        self.enforce()

    def tier_bytes(self, tier: str) -> int:
        return sum(e.nbytes for e in self.entries.values() if e.tier == tier)

    def enforce(self) -> None:
        if self.device_budget is not None:
            for eid in self.lru():
                if self.tier_bytes("device") <= self.device_budget:
                    break
                e = self.entries[eid]
                if e.tier != "device" or e.users:
                    continue
                if self.host_budget == 0:
                    del self.entries[eid]
                    self.counters["evictions"] += 1
                else:
                    e.tier = "host"
                    self.counters["offloads"] += 1
        if self.host_budget is not None:
            for eid in self.lru():
                if self.tier_bytes("host") <= self.host_budget:
                    break
                e = self.entries[eid]
                if e.tier != "host" or e.users:
                    continue
                del self.entries[eid]
                self.counters["evictions"] += 1
