"""The cache's policy: byte budgets per tier, tenant shares, the eviction order, and what the disk tier admits.

The map (:class:`cache.PrefixCache`: entries, radix indexes, leases, pins, tensors, files) keeps the policy told of
every fact the policy decides on, and asks it what to do; the policy never sees an entry's tokens, tensors or files,
and never acts itself. The interface, in full:

*Told* (the map calls these as things happen; each is cheap):

- :meth:`TierPolicy.added` an entry (its tenant, tier, distinct tensor storages, file bytes), :meth:`~TierPolicy.used`
  (a hit, an insert, an acquire, a pin: the LRU order), :meth:`~TierPolicy.placed` in another tier,
  :meth:`~TierPolicy.filed` (a file on the disk tier gained or lost), :meth:`~TierPolicy.set_busy` (in use or
  pinned: never moved nor dropped), :meth:`~TierPolicy.removed`, and :meth:`~TierPolicy.dormant` (the files of
  earlier runs no namespace has adopted yet).

*Asked*:

- :meth:`~TierPolicy.evictions`: which entries leave which tier now, one :class:`Eviction` at a time; the map carries
  each out (and tells the policy what changed) before asking for the next, so each entry is judged when its turn
  comes. :meth:`~TierPolicy.disk_evictions` does the disk tier alone.
- :meth:`~TierPolicy.admits_file`: whether a file of that many bytes may go on the disk tier at all.
- :meth:`~TierPolicy.survives`: whether enforcing the budgets now would keep an entry in some tier (supersession
  drops older entries only if so).
- :meth:`~TierPolicy.pin_fits`: whether pinning an entry keeps the pinned bytes within their bounds.
- reports: :meth:`~TierPolicy.order` (least recently used first), :meth:`~TierPolicy.tier_bytes`,
  :meth:`~TierPolicy.per_tenant`, :meth:`~TierPolicy.storage_bytes`.

The rules (cache/DESIGN.md, *Tiers, budgets, eviction* and *Tenant shares*): one LRU order over all entries. When a
memory tier is over its budget its idle entries go, in this order: those that cannot fit the tier at all beside the
entries in use; then, with tenant shares on, entries of tenants over their share (``floor(share * budget)`` bytes
while another tenant holds bytes there), first those that cannot fit the share beside their tenant's entries in use;
then any; each group least recently used first. Device entries move to the host tier (:data:`OFFLOAD`) unless the
host budget is 0 or too small for the entry alone; host entries leave memory (:data:`LEAVE_MEMORY`: to the disk tier
if the entry has or can get a file, else dropped). Over the disk budget: files that cannot fit at all, then files of
earlier runs (:data:`DROP_DORMANT`), then the same share groups and LRU (:data:`LOSE_FILE`). Memory bytes are bytes of
distinct storages per tier (and per tenant); disk bytes are file bytes per entry, plus the dormant files.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from cache.radix import EntryId
from cache.tenants import StorageCounts, Storages, TenantBytes, share_limit
from cache.tiers import DEVICE, DISK, HOST, MEMORY_TIERS, TIERS

OFFLOAD = "offload"  # device -> host tier
LEAVE_MEMORY = "leave_memory"  # out of memory: to the disk tier if it has (or can get) a file, else dropped
LOSE_FILE = "lose_file"  # its file goes, and the entry with it if that was its only copy
DROP_DORMANT = "drop_dormant"  # the least recently used file of an earlier run goes (no entry)


@dataclass(frozen=True, slots=True)
class Eviction:
    """One thing the map is to do now for a tier's budget."""

    action: str  # OFFLOAD, LEAVE_MEMORY, LOSE_FILE or DROP_DORMANT
    eid: EntryId | None  # the entry; None for DROP_DORMANT


@dataclass(slots=True, eq=False)
class Held:
    """The policy's view of one entry: no tokens, no tensors, no files."""

    eid: EntryId
    salt: str  # its tenant
    tier: str  # DEVICE, HOST or DISK
    storages: tuple[tuple[tuple, int], ...]  # (key, bytes) of its distinct tensor storages while in memory
    mem_bytes: int  # their bytes (shared ones counted in full)
    file_bytes: int | None  # bytes of its file on the disk tier, None without one
    busy: bool = False  # in use or pinned: never moved nor dropped


@dataclass(frozen=True, slots=True)
class Fact:
    """What the map knows of one entry, for :meth:`TierPolicy.check`."""

    eid: EntryId
    salt: str
    tier: str
    storages: tuple[tuple[tuple, int], ...]
    file_bytes: int | None
    busy: bool


def storages_union(entries: Iterable[Held]) -> dict[tuple, int]:
    """Distinct storages of several entries: key -> bytes."""
    out: dict[tuple, int] = {}
    for held in entries:
        out.update(held.storages)
    return out


class TierPolicy:
    """Budgets, shares, the LRU order and the ledger of bytes per tier and tenant. Not thread-safe."""

    def __init__(self, budgets: Mapping[str, int | None], share: float | None) -> None:
        """``budgets``: tier -> bytes (None: unlimited; the disk tier's 0 when off). ``share``: a tenant's fraction
        of each tier's budget while another tenant holds bytes there; None: shares off."""
        self.budgets: dict[str, int | None] = {tier: budgets[tier] for tier in TIERS}
        self.share = share
        self._held: OrderedDict[EntryId, Held] = OrderedDict()  # least -> most recently used
        self._busy: dict[EntryId, Held] = {}  # in use or pinned (all on the device tier)
        self._storages: dict[str, StorageCounts] = {t: StorageCounts() for t in MEMORY_TIERS}  # distinct storages
        self._bytes: dict[str, int] = dict.fromkeys(TIERS, 0)  # bytes per tier (disk: files and dormant files)
        self._tenants = TenantBytes()  # entries and bytes per tenant and tier
        self._dormant = (0, False)  # (bytes, whether any) of earlier runs' files nobody adopted yet

    # ================================================================ told by the map

    def added(
        self,
        eid: EntryId,
        salt: str,
        tier: str,
        storages: Storages = (),
        file_bytes: int | None = None,
        *,
        oldest: bool = False,
    ) -> None:
        """A new entry, the most recently used (``oldest``: the least, for files found on disk)."""
        held = Held(eid, salt, tier, (), 0, None)
        self._held[eid] = held
        if oldest:
            self._held.move_to_end(eid, last=False)
        self._tenants.add_entry(salt)
        if tier != DISK:
            self._count(held, tuple(storages))
        if file_bytes is not None:
            self.filed(eid, file_bytes)

    def used(self, eid: EntryId) -> None:
        self._held.move_to_end(eid)

    def placed(self, eid: EntryId, tier: str, storages: Storages = ()) -> None:
        """The entry is now in ``tier`` with these storages (none on the disk tier)."""
        held = self._held[eid]
        if held.tier != DISK:
            self._uncount(held)
        held.tier = tier
        if tier != DISK:
            self._count(held, tuple(storages))

    def filed(self, eid: EntryId, file_bytes: int | None) -> None:
        """The entry has a file of ``file_bytes`` on the disk tier now (None: no file any more)."""
        held = self._held[eid]
        if held.file_bytes is not None:
            self._bytes[DISK] -= held.file_bytes
            self._tenants.remove_file(held.salt, held.file_bytes)
        held.file_bytes = file_bytes
        if file_bytes is not None:
            self._bytes[DISK] += file_bytes
            self._tenants.add_file(held.salt, file_bytes)

    def set_busy(self, eid: EntryId, busy: bool) -> None:
        held = self._held[eid]
        held.busy = busy
        if busy:
            self._busy[eid] = held
        else:
            self._busy.pop(eid, None)

    def removed(self, eid: EntryId) -> None:
        held = self._held[eid]
        self.filed(eid, None)
        if held.tier != DISK:
            self._uncount(held)
        self._busy.pop(eid, None)
        del self._held[eid]
        self._tenants.remove_entry(held.salt)

    def dormant(self, nbytes: int, any_files: bool) -> None:
        """The files of earlier runs no namespace has adopted yet: their bytes, and whether there are any."""
        self._bytes[DISK] += nbytes - self._dormant[0]
        self._dormant = (nbytes, any_files)

    # ================================================================ asked by the map

    def evictions(self, spare: EntryId | None = None) -> Iterator[Eviction]:
        """What leaves which tier now, memory tiers first, then the disk tier. Lazy: carry each out (telling the
        policy) before asking for the next. ``spare``: an idle entry that stays in memory this time (a lookup's
        read-back, about to be acquired); its file may still go."""
        for tier in MEMORY_TIERS:
            budget = self.budgets[tier]
            if budget is None or self._bytes[tier] <= budget:
                continue
            idle = [h for h in self._held.values() if h.tier == tier and not h.busy and h.eid != spare]
            leased = storages_union(self._busy.values()) if tier == DEVICE else None
            too_big = [h for h in idle if self._too_big(h, tier, leased)]
            for held in itertools.chain(too_big, self._over_share_order(tier, idle), idle):
                if self._bytes[tier] <= budget:
                    break
                if not self._holds(held, tier):
                    continue  # moved or dropped already in this pass
                if tier == DEVICE and self.budgets[HOST] != 0 and not self._too_big(held, HOST):
                    yield Eviction(OFFLOAD, held.eid)
                else:
                    yield Eviction(LEAVE_MEMORY, held.eid)
        yield from self.disk_evictions()

    def disk_evictions(self) -> Iterator[Eviction]:
        """The disk tier's part of :meth:`evictions`: files that cannot fit at all, earlier runs' files, then the
        share groups and the LRU."""
        budget = self.budgets[DISK]
        assert budget is not None
        if self._bytes[DISK] <= budget:
            return
        idle = [h for h in self._held.values() if h.file_bytes is not None and not h.busy]
        too_big = [h for h in idle if self._too_big(h, DISK)]
        for held in too_big:
            yield Eviction(LOSE_FILE, held.eid)
        while self._bytes[DISK] > budget and self._dormant[1]:
            yield Eviction(DROP_DORMANT, None)
        for held in itertools.chain(self._over_share_order(DISK, idle), idle):
            if self._bytes[DISK] <= budget:
                break
            if self._holds(held, DISK):
                yield Eviction(LOSE_FILE, held.eid)

    def admits_file(self, nbytes: int) -> bool:
        """Whether a file of ``nbytes`` may go on the disk tier at all (it fits the budget alone)."""
        budget = self.budgets[DISK]
        return budget is not None and nbytes <= budget

    def survives(self, eid: EntryId, *, disk_healthy: bool) -> bool:
        """Whether enforcing the budgets now would keep the entry (one in memory: a new entry) in some tier: it must
        fit beside the entries in use on the device tier, or alone on the host tier, or its file beside theirs on
        disk (while writes work).
        With tenant shares on and another tenant's entry held, it must also fit its tenant's share of that tier
        beside its tenant's entries in use there, or the share rule could push it out."""
        held = self._held[eid]
        return (
            self._keeps(held, DEVICE)
            or (self.budgets[HOST] != 0 and self._keeps(held, HOST))
            or (held.file_bytes is not None and disk_healthy and self._keeps(held, DISK))
        )

    def pin_fits(self, eid: EntryId, holders: Collection[EntryId]) -> bool:
        """Whether pinning the entry keeps its tenant's pinned bytes (the distinct storages of ``holders``, the
        entries holding pins, of its tenant) within its share of the device budget (all of it with shares off) and
        all pinned bytes within that budget."""
        budget = self.budgets[DEVICE]
        if budget is None or eid in holders:
            return True
        held = self._held[eid]
        pinned = [self._held[h] for h in sorted(holders)]
        own = [h for h in pinned if h.salt == held.salt]
        limit = share_limit(self.share if self.share is not None else 1.0, budget)
        assert limit is not None
        return (
            sum(storages_union([*own, held]).values()) <= limit
            and sum(storages_union([*pinned, held]).values()) <= budget
        )

    # ================================================================ reports

    def order(self) -> list[EntryId]:
        """Every entry, least recently used first."""
        return list(self._held)

    def reversed_order(self) -> Iterator[EntryId]:
        """Every entry, most recently used first."""
        return reversed(self._held)

    def tier_bytes(self) -> dict[str, int]:
        return dict(self._bytes)

    def total_bytes(self) -> int:
        return sum(self._bytes.values())

    def per_tenant(self) -> dict[str, dict[str, int]]:
        """salt -> tier -> bytes, for every tenant holding an entry."""
        return self._tenants.per_tenant()

    def storage_bytes(self, eids: Iterable[EntryId]) -> int:
        """Bytes of the distinct storages of these entries."""
        return sum(storages_union(self._held[e] for e in eids).values())

    def check(self, facts: Iterable[Fact], dormant_bytes: int) -> None:
        """Assert that the policy's view matches the map's ``facts`` (one per entry) and ``dormant_bytes`` (of
        earlier runs' files), and that its ledger matches a count from scratch (tests)."""
        facts = list(facts)
        assert self._dormant[0] == dormant_bytes, "dormant files' bytes drifted"
        assert set(self._held) == {f.eid for f in facts}, "the policy's entries and the map's disagree"
        expected = {t: StorageCounts() for t in MEMORY_TIERS}
        tenants = TenantBytes()
        disk_bytes = self._dormant[0]
        for fact in facts:
            held = self._held[fact.eid]
            assert (held.salt, held.tier, held.file_bytes, held.busy) == (
                fact.salt,
                fact.tier,
                fact.file_bytes,
                fact.busy,
            ), f"the policy's view of entry {fact.eid} drifted"
            tenants.add_entry(fact.salt)
            if fact.file_bytes is not None:
                disk_bytes += fact.file_bytes
                tenants.add_file(fact.salt, fact.file_bytes)
            if fact.tier == DISK:
                continue
            assert dict(held.storages) == dict(fact.storages), "storage accounting drifted"
            expected[fact.tier].add(fact.storages)
            tenants.add_storages(fact.tier, fact.salt, fact.storages)
        assert expected == self._storages, "storage accounting drifted"
        for tier in MEMORY_TIERS:
            assert self._bytes[tier] == sum(b for _, b in expected[tier].refs.values())
        assert self._bytes[DISK] == disk_bytes, "disk accounting drifted"
        assert tenants == self._tenants, "per-tenant accounting drifted"
        assert set(self._busy) == {f.eid for f in facts if f.busy}, "entries in use disagree"

    # ================================================================ the rules

    def _count(self, held: Held, storages: tuple[tuple[tuple, int], ...]) -> None:
        held.storages = storages
        held.mem_bytes = sum(nbytes for _, nbytes in storages)
        self._bytes[held.tier] += self._storages[held.tier].add(storages)
        self._tenants.add_storages(held.tier, held.salt, storages)

    def _uncount(self, held: Held) -> None:
        self._bytes[held.tier] -= self._storages[held.tier].remove(held.storages)
        self._tenants.remove_storages(held.tier, held.salt, held.storages)
        held.storages, held.mem_bytes = (), 0

    def _fits(
        self,
        held: Held,
        tier: str,
        limit: int,
        in_use: Collection[Held],
        in_use_storages: dict[tuple, int] | None = None,
    ) -> bool:
        """Whether ``held`` fits in ``limit`` bytes of ``tier`` beside the entries ``in_use`` (all on the device
        tier) and nothing else. ``in_use_storages``: their storages, if the caller has them."""
        if tier == DISK:
            assert held.file_bytes is not None
            files = sum(h.file_bytes for h in in_use if h.file_bytes is not None and h is not held)
            return held.file_bytes + files <= limit
        if tier == HOST or not in_use:
            return held.mem_bytes <= limit
        if in_use_storages is None:
            in_use_storages = storages_union(in_use)
        if held.mem_bytes + sum(in_use_storages.values()) <= limit:
            return True
        return sum({**in_use_storages, **dict(held.storages)}.values()) <= limit

    def _too_big(self, held: Held, tier: str, leased: dict[tuple, int] | None = None) -> bool:
        """Whether the entry cannot be held in ``tier`` even with every other idle entry gone from it (the entries
        in use stay: they are all on the device tier). ``leased``: their storages, if the caller has them."""
        budget = self.budgets[tier]
        return budget is not None and not self._fits(held, tier, budget, tuple(self._busy.values()), leased)

    def _keeps(self, held: Held, tier: str) -> bool:
        """:meth:`survives` for one tier."""
        if self._too_big(held, tier):
            return False
        limit = share_limit(self.share, self.budgets[tier])
        if limit is None or self._tenants.tenants() < 2:
            return True
        return self._fits(held, tier, limit, tuple(h for h in self._busy.values() if h.salt == held.salt))

    def _over_share_order(self, tier: str, idle: list[Held]) -> Iterator[Held]:
        """With shares on: the entries of ``idle`` (least recently used first) still in ``tier`` whose tenant is
        over its share there, first those that cannot fit within the share beside their tenant's entries in use,
        then the others, each group least recently used first. Lazy: each entry is judged when the caller asks for
        it, after the one before it has gone. A tenant's bytes in a tier only fall while the tier's budget is
        enforced, so a tenant found not over its share stays so, and one scan per group suffices."""
        limit = share_limit(self.share, self.budgets[tier])
        if limit is None or self._tenants.tenants() < 2:
            return
        in_use: dict[str, list[Held]] = {}
        for held in self._busy.values():
            in_use.setdefault(held.salt, []).append(held)
        in_use_storages = {salt: storages_union(entries) for salt, entries in in_use.items()}

        def beyond_share(held: Held) -> bool:
            return not self._fits(held, tier, limit, in_use.get(held.salt, ()), in_use_storages.get(held.salt))

        beyond = [h for h in idle if self._holds(h, tier) and beyond_share(h)]
        for group in (beyond, idle):
            for held in group:
                if self._holds(held, tier) and self._tenants.over_share(tier, held.salt, limit):
                    yield held

    def _holds(self, held: Held, tier: str) -> bool:
        """Whether the entry is still held in ``tier`` (for the disk tier: has a file)."""
        if self._held.get(held.eid) is not held:
            return False
        return held.file_bytes is not None if tier == DISK else held.tier == tier
