"""A deliberately simple model of the prefix cache: a linear scan over every entry, each rule applied literally.

It shares no code with :mod:`cache` beyond the value types, so the property tests compare two independent readings
of the same rules. Sizes are counted per entry (the tests never share tensors between entries); an entry's file
holds ``dbytes`` bytes.

Rules, as written in cache/DESIGN.md:

- tiers: device, host (memory) and disk (files); with a disk tier every new entry gets a file if it fits the disk
  budget at all; an entry that leaves memory stays on disk if it has (or can get) a file, else it is dropped;
- each tier over its budget: its idle entries go, first those that cannot fit there even alone beside the entries in
  use, then the least recently used; device -> host (or out of memory if the host budget is 0 or too small for the
  entry alone), host -> out of memory,
  disk: the file goes, and the entry with it if it was only on disk;
- a lookup that reads an entry back from disk (into the device tier) enforces the budgets without moving that entry
  out of memory (the acquire that follows would bring it back);
- a flush gives a file to every entry in memory that has none (most recently used first), then enforces the disk
  budget;
- supersession: an insert drops the entries it covers only if, enforcing the budgets without dropping them, the new
  entry would still be held (this model finds out by trying on a copy of itself); a superseded entry in use is
  dropped at its last release only if some held entry covers it then;
- tenant shares (``share``; a tenant is a namespace salt): a tenant is over its share of a tier when it holds more
  than floor(share * budget) bytes there while another tenant holds bytes there. Each time a tier over its budget
  needs a victim, it is the first idle entry of the tier, in LRU order, that: cannot fit the tier beside the entries
  in use; else belongs to a tenant over its share and cannot fit that share beside its tenant's entries in use;
  else belongs to a tenant over its share; else any. With shares on and entries of two tenants held, an insert
  supersedes only if the new entry fits some tier (as above) and its tenant's share of it beside its tenant's
  entries in use (and then the trial on a copy must keep it too). Every entry (or file) that leaves a tier for its
  budget is logged in ``moves`` with the tenants' bytes there at that moment;
- pins (``pin``, ``expire``; time is ``now``, set by the caller): a pin names (namespace, tokens[:length], the
  media before length) and lives on one entry, its holder, which counts as an entry in use (*busy*) everywhere above
  (never moved, never dropped, beside-the-entries-in-use includes it) until no pin and no lease holds it. A new pin
  goes on the most recently used entry that serves exactly that prefix (read back from disk if need be), unless its
  bytes would take its tenant's pinned bytes past floor((pin_share or 1) * device budget) or all pinned bytes past
  the device budget (refused "over_share"; none serves it: "not_cached"; either way the budgets are then enforced);
  the holder moves to the device tier and is touched. Pinning a pinned prefix renews it (its ttl the longer of
  both, its expiry pushed to now + ttl if later) and touches its holder. A lookup hit on the holder at the pin's
  length or beyond pushes its expiry to now + ttl if later. An insert that supersedes a holder hands its pins to
  the new entry. ``expire`` removes the pins whose expiry is <= now (all first, in expiry then creation order), then
  settles their holders (a superseded one that is idle now is dropped if another entry covers it), then enforces
  the budgets once.
"""

from __future__ import annotations

import copy
import math
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
    nbytes: int  # bytes in memory
    dbytes: int  # bytes of its file
    recency: int
    tier: str = "device"
    file: bool = False  # has a file on the disk tier
    users: int = 0
    superseded: bool = False
    pins: int = 0  # pins it holds

    @property
    def busy(self) -> bool:
        """In use or pinned: never moved, never dropped."""
        return bool(self.users or self.pins)

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


def covers(big: RefEntry, small: RefEntry) -> bool:
    return (
        big.namespace == small.namespace
        and shares_prefix(big.tokens, big.media, small.tokens, small.media)
        and small.servable() <= big.servable()
    )


@dataclass(frozen=True)
class Move:
    """An entry (or its file, on the disk tier) leaving a tier for the tier's budget, as it happened."""

    tier: str
    eid: int
    salt: str  # the entry's tenant
    fits: bool  # whether the entry could fit in the tier beside the entries in use
    tenant_bytes: dict[str, int]  # salt -> bytes it held in the tier just before the move
    idle: dict[str, int]  # salt -> idle entries it held in the tier just before the move


@dataclass
class RefPin:
    key: tuple  # (namespace, tokens[:length], media spans before length)
    length: int
    ttl: float
    expires: float
    holder: int
    number: int


@dataclass
class ReferenceCache:
    device_budget: int | None = None
    host_budget: int | None = 0
    disk_budget: int = 0  # 0: no disk tier
    share: float | None = None  # tenant share of each tier's budget; None: off
    entries: dict[int, RefEntry] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)
    clock: int = 0
    now: float = 0.0  # the time pins are made, used and expire at (set by the caller)
    pins: dict[tuple, RefPin] = field(default_factory=dict)
    pin_share: float | None = None  # the share that limits pins (the real cache's, even where ``share`` is None)
    pin_numbers: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: {"offloads": 0, "evictions": 0, "superseded": 0, "spills": 0}
    )

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def lru(self) -> list[int]:
        return [e.eid for e in sorted(self.entries.values(), key=lambda e: e.recency)]

    # -- the rules

    def lookup(self, namespace, tokens, media) -> tuple[int, int] | None:
        """(length, entry) of the best prefix, touching the entry (and reading it back from disk); None on a miss."""
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
        hit = self.entries[best[2]]
        hit.recency = self._tick()
        for pin in self.pins.values():
            if pin.holder == hit.eid and pin.length <= best[0]:
                pin.expires = max(pin.expires, self.now + pin.ttl)
        if hit.tier == "disk":
            hit.tier = "device"
            self.enforce(spare=hit.eid)  # read back for the acquire that follows: it stays in memory this time
        return best[0], best[2]

    def insert(self, eid: int, namespace, tokens, media, lo, points, nbytes, dbytes) -> tuple[int, bool]:
        """Apply an insert; ``eid`` is the id the real cache returned. Returns (the serving entry, whether a new
        entry was added)."""
        points = None if points is None else frozenset(points)
        new = RefEntry(eid, namespace, list(tokens), tuple(sorted(media)), lo, points, nbytes, dbytes, 0)
        covering = [e for e in self.entries.values() if covers(e, new)]
        if covering:
            best = max(covering, key=lambda e: e.recency)
            best.recency = self._tick()
            return best.eid, False
        new.recency = self._tick()
        new.file = self.disk_budget > 0 and dbytes <= self.disk_budget
        self.entries[eid] = new
        covered = [e for e in self.entries.values() if e.eid != eid and covers(new, e)]
        if covered and self._would_keep(eid):
            for e in covered:
                for pin in self.pins.values():
                    if pin.holder == e.eid:
                        pin.holder = eid
                new.pins += e.pins
                e.pins = 0
                if e.users:
                    e.superseded = True
                else:
                    del self.entries[e.eid]
                    self.counters["superseded"] += 1
        self.enforce()
        return eid, True

    def _would_keep(self, eid: int) -> bool:
        trial = copy.deepcopy(self)
        trial.enforce()
        kept = eid in trial.entries
        if self.share is None or len({e.namespace.salt for e in self.entries.values()}) < 2:
            return kept
        new = self.entries[eid]
        tiers = ["device"] + ["host"] * (self.host_budget != 0) + ["disk"] * new.file
        within = any(self.fits_alone(new, tier) and self.fits_share(new, tier) for tier in tiers)
        assert kept or not within, "the share rule would push out an entry that fit its share"
        return within

    def acquire(self, eid: int) -> None:
        e = self.entries[eid]
        e.tier = "device"
        e.users += 1
        e.recency = self._tick()
        self.enforce()

    def release(self, eid: int) -> None:
        e = self.entries[eid]
        e.users -= 1
        self.settle(e)
        self.enforce()

    def settle(self, e: RefEntry) -> None:
        if e.superseded and not e.busy:
            e.superseded = False
            if any(o.eid != e.eid and covers(o, e) for o in self.entries.values()):
                del self.entries[e.eid]
                self.counters["superseded"] += 1

    # -- pins

    def pin(self, namespace, tokens, media, length: int, ttl: float) -> tuple[bool, str | None, bool]:
        """(pinned, refusal reason, renewed)."""
        spans = tuple(sorted(media))
        key = (namespace, tuple(tokens[:length]), spans_before(spans, length))
        existing = self.pins.get(key)
        if existing is not None:
            existing.ttl = max(existing.ttl, ttl)
            existing.expires = max(existing.expires, self.now + existing.ttl)
            self.entries[existing.holder].recency = self._tick()
            return True, None, True
        if any(s.start < length < s.end for s in spans):
            self.enforce()
            return False, "not_cached", False
        serving = [
            e
            for e in self.entries.values()
            if e.namespace == namespace
            and length in e.servable()
            and e.tokens[:length] == list(tokens[:length])
            and spans_before(e.media, length) == key[2]
        ]
        if not serving:
            self.enforce()
            return False, "not_cached", False
        holder = max(serving, key=lambda e: e.recency)
        if holder.tier == "disk":
            holder.tier = "device"  # read back
        if not self.pin_fits(holder):
            self.enforce()
            return False, "over_share", False
        holder.tier = "device"
        holder.pins += 1
        self.pin_numbers += 1
        self.pins[key] = RefPin(key, length, ttl, self.now + ttl, holder.eid, self.pin_numbers)
        holder.recency = self._tick()
        self.enforce()
        return True, None, False

    def pin_fits(self, holder: RefEntry) -> bool:
        if self.device_budget is None or holder.pins:
            return True
        pinned = [e for e in self.entries.values() if e.pins]
        own = sum(e.nbytes for e in pinned if e.namespace.salt == holder.namespace.salt)
        limit = math.floor((self.pin_share if self.pin_share is not None else 1.0) * self.device_budget)
        return own + holder.nbytes <= limit and sum(e.nbytes for e in pinned) + holder.nbytes <= self.device_budget

    def expire(self) -> int:
        due = sorted((p for p in self.pins.values() if p.expires <= self.now), key=lambda p: (p.expires, p.number))
        for pin in due:
            del self.pins[pin.key]
            self.entries[pin.holder].pins -= 1
        for pin in due:
            if pin.holder in self.entries:
                self.settle(self.entries[pin.holder])
        if due:
            self.enforce()
        return len(due)

    def flush(self) -> None:
        """Give a file to every entry in memory that has none and fits the disk budget, most recent first; then
        enforce the disk budget."""
        if self.disk_budget == 0:
            return
        for eid in reversed(self.lru()):
            e = self.entries[eid]
            if e.tier != "disk" and not e.file and e.dbytes <= self.disk_budget:
                e.file = True
        self.enforce_disk()

    def evict_all_idle(self) -> int:
        idle = [e for e in self.entries.values() if not e.busy]
        for e in idle:
            del self.entries[e.eid]
        self.counters["evictions"] += len(idle)
        return len(idle)

    # -- budgets

    def tier_bytes(self, tier: str) -> int:
        if tier == "disk":
            return sum(e.dbytes for e in self.entries.values() if e.file)
        return sum(e.nbytes for e in self.entries.values() if e.tier == tier)

    def fits_alone(self, e: RefEntry, tier: str) -> bool:
        """Whether ``e`` fits in ``tier`` beside the entries in use (and nothing else)."""
        in_use = [o for o in self.entries.values() if o.busy and o.eid != e.eid]
        if tier == "device":
            return self.device_budget is None or e.nbytes + sum(o.nbytes for o in in_use) <= self.device_budget
        if tier == "host":
            return self.host_budget is None or e.nbytes <= self.host_budget
        return e.dbytes + sum(o.dbytes for o in in_use if o.file) <= self.disk_budget

    # -- tenant shares

    def in_tier(self, e: RefEntry, tier: str) -> bool:
        return e.file if tier == "disk" else e.tier == tier

    def entry_bytes(self, e: RefEntry, tier: str) -> int:
        return e.dbytes if tier == "disk" else e.nbytes

    def tenant_bytes(self, tier: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries.values():
            if self.in_tier(e, tier):
                out[e.namespace.salt] = out.get(e.namespace.salt, 0) + self.entry_bytes(e, tier)
        return out

    def limit(self, tier: str) -> int | None:
        budget = {"device": self.device_budget, "host": self.host_budget, "disk": self.disk_budget}[tier]
        return None if self.share is None or budget is None else math.floor(self.share * budget)

    def over_share(self, tier: str, salt: str) -> bool:
        limit = self.limit(tier)
        held = self.tenant_bytes(tier)
        others = any(nbytes for other, nbytes in held.items() if other != salt)
        return limit is not None and held.get(salt, 0) > limit and others

    def fits_share(self, e: RefEntry, tier: str) -> bool:
        """Whether ``e`` fits its tenant's share of ``tier`` beside its tenant's entries in use."""
        limit = self.limit(tier)
        if limit is None:
            return True
        same = [o for o in self.entries.values() if o.busy and o.eid != e.eid and o.namespace == e.namespace]
        if tier == "device":
            return e.nbytes + sum(o.nbytes for o in same) <= limit
        if tier == "host":
            return e.nbytes <= limit
        return e.dbytes + sum(o.dbytes for o in same if o.file) <= limit

    def victim(self, tier: str, spare: int | None = None) -> RefEntry | None:
        """The idle entry of ``tier`` that goes next (see the module docstring), never ``spare``; None if there is
        none."""
        idle = [self.entries[i] for i in self.lru() if self.in_tier(self.entries[i], tier)]
        idle = [e for e in idle if not e.busy and e.eid != spare]
        rules = (
            lambda e: not self.fits_alone(e, tier),
            lambda e: self.over_share(tier, e.namespace.salt) and not self.fits_share(e, tier),
            lambda e: self.over_share(tier, e.namespace.salt),
            lambda e: True,
        )
        for rule in rules:
            for e in idle:
                if rule(e):
                    return e
        return None

    def log_move(self, tier: str, e: RefEntry, spare: int | None = None) -> None:
        """``spare`` (a lookup's read-back, about to be acquired) is not counted idle: it cannot be moved."""
        idle: dict[str, int] = {}
        for o in self.entries.values():
            if self.in_tier(o, tier) and not o.busy and o.eid != spare:
                idle[o.namespace.salt] = idle.get(o.namespace.salt, 0) + 1
        fits = self.fits_alone(e, tier)
        self.moves.append(Move(tier, e.eid, e.namespace.salt, fits, self.tenant_bytes(tier), idle))

    def enforce(self, spare: int | None = None) -> None:
        """``spare``: an idle entry that stays in memory this time (its file may go)."""
        for tier, budget in (("device", self.device_budget), ("host", self.host_budget)):
            if budget is None:
                continue
            while self.tier_bytes(tier) > budget and (e := self.victim(tier, spare)) is not None:
                self.log_move(tier, e, spare)
                if tier == "device" and self.host_budget != 0 and self.fits_alone(e, "host"):
                    e.tier = "host"
                    self.counters["offloads"] += 1
                else:
                    self.leave_memory(e)
        self.enforce_disk()

    def enforce_disk(self) -> None:
        if self.disk_budget > 0:
            for e in [e for e in self.entries.values() if e.file and not e.busy and not self.fits_alone(e, "disk")]:
                self.log_move("disk", e)
                self.lose_file(e)
            while self.tier_bytes("disk") > self.disk_budget and (e := self.victim("disk")) is not None:
                self.log_move("disk", e)
                self.lose_file(e)

    def lose_file(self, e: RefEntry) -> None:
        e.file = False
        if e.tier == "disk":
            del self.entries[e.eid]
            self.counters["evictions"] += 1

    def leave_memory(self, e: RefEntry) -> None:
        if not e.file and self.disk_budget > 0 and e.dbytes <= self.disk_budget:
            e.file = True
        if e.file:
            e.tier = "disk"
            self.counters["spills"] += 1
        else:
            del self.entries[e.eid]
            self.counters["evictions"] += 1
