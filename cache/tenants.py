"""Tenant shares: the bytes each tenant holds in each tier, and whether a tenant is over its share of a tier.

A tenant is a namespace salt (the server derives it from the tenant id). With a share ``s`` of a tier whose budget is
``B`` bytes, a tenant is *over its share* of that tier when it holds more than ``floor(s * B)`` bytes there **and
another tenant holds bytes there too**: alone in a tier, a tenant may use all of it. Over a tier's budget the cache
takes from tenants over their share first (see :class:`cache.PrefixCache`).

Memory bytes are counted per distinct tensor storage among a tenant's entries in a tier (a storage that two tenants'
entries share counts for each of them); disk bytes are the tensor bytes of the tenant's entry files (files of earlier
runs that no namespace has adopted yet belong to no tenant).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from cache.tiers import DISK, MEMORY_TIERS, TIERS

Storages = Iterable[tuple[tuple, int]]  # (storage key, bytes) of distinct tensor storages


def share_limit(share: float | None, budget: int | None) -> int | None:
    """The bytes a tenant may hold in a tier of ``budget`` bytes while another tenant needs room; None: no limit
    (shares off, or an unlimited tier)."""
    if share is None or budget is None:
        return None
    return math.floor(share * budget)


@dataclass(slots=True)
class StorageCounts:
    """Distinct tensor storages held by some entries, each with the number of entries holding it."""

    refs: dict[tuple, list[int]] = field(default_factory=dict)  # storage key -> [entries holding it, its bytes]
    nbytes: int = 0  # bytes of the distinct storages, each counted once

    def add(self, storages: Storages) -> int:
        """Count one more holder of each storage. Returns the bytes of the storages counted for the first time."""
        added = 0
        for key, nbytes in storages:
            slot = self.refs.get(key)
            if slot is None:
                self.refs[key] = [1, nbytes]
                added += nbytes
            else:
                slot[0] += 1
        self.nbytes += added
        return added

    def remove(self, storages: Storages) -> int:
        """Count one holder less of each storage (each must be counted). Returns the bytes no longer held."""
        freed = 0
        for key, _ in storages:
            slot = self.refs[key]
            slot[0] -= 1
            if slot[0] == 0:
                del self.refs[key]
                freed += slot[1]
        self.nbytes -= freed
        return freed


@dataclass(slots=True)
class TenantBytes:
    """What each tenant (namespace salt) holds: entries, memory bytes per tier, file bytes. Tenants holding nothing
    of a kind are left out of that table, so that two ledgers of the same holdings compare equal."""

    entries: Counter[str] = field(default_factory=Counter)  # salt -> entries held (any tier)
    memory: dict[str, dict[str, StorageCounts]] = field(
        default_factory=lambda: {tier: {} for tier in MEMORY_TIERS}
    )  # tier -> salt -> the storages of its entries in that tier
    files: dict[str, int] = field(default_factory=dict)  # salt -> bytes of its entries' files on the disk tier

    def add_entry(self, salt: str) -> None:
        self.entries[salt] += 1

    def remove_entry(self, salt: str) -> None:
        self.entries[salt] -= 1
        if not self.entries[salt]:
            del self.entries[salt]

    def add_storages(self, tier: str, salt: str, storages: Storages) -> None:
        storages = list(storages)
        if storages:  # an entry holding no tensor (stateless layers only) leaves the tenant out of the tier's table
            self.memory[tier].setdefault(salt, StorageCounts()).add(storages)

    def remove_storages(self, tier: str, salt: str, storages: Storages) -> None:
        storages = list(storages)
        if not storages:
            return
        counts = self.memory[tier][salt]
        counts.remove(storages)
        if not counts.refs:
            del self.memory[tier][salt]

    def add_file(self, salt: str, nbytes: int) -> None:
        if nbytes:
            self.files[salt] = self.files.get(salt, 0) + nbytes

    def remove_file(self, salt: str, nbytes: int) -> None:
        if nbytes:
            self.files[salt] -= nbytes
            if not self.files[salt]:
                del self.files[salt]

    def bytes_in(self, tier: str, salt: str) -> int:
        """Bytes ``salt`` holds in ``tier``."""
        if tier == DISK:
            return self.files.get(salt, 0)
        counts = self.memory[tier].get(salt)
        return counts.nbytes if counts is not None else 0

    def over_share(self, tier: str, salt: str, limit: int | None) -> bool:
        """Whether ``salt`` holds more than ``limit`` bytes of ``tier`` while another tenant holds bytes there."""
        if limit is None or self.bytes_in(tier, salt) <= limit:
            return False
        holders = self.files if tier == DISK else {s: c.nbytes for s, c in self.memory[tier].items()}
        return any(nbytes for other, nbytes in holders.items() if other != salt)

    def tenants(self) -> int:
        """How many tenants hold entries."""
        return len(self.entries)

    def per_tenant(self) -> dict[str, dict[str, int]]:
        """salt -> tier -> bytes, for every tenant holding an entry."""
        return {salt: {tier: self.bytes_in(tier, salt) for tier in TIERS} for salt in sorted(self.entries)}
