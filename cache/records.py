"""What the prefix cache hands out: matches, leases and statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from cache.layers import RestoredLayer
from cache.media import MediaKind, MediaSpan
from cache.namespace import Namespace
from cache.radix import EntryId


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The best cached prefix of a query. Compute the query from ``length`` on."""

    namespace: Namespace  # namespace the query was looked up in
    entry: EntryId  # the entry that serves it
    length: int  # tokens served from the cache (>= 1, < query_length)
    query_length: int  # tokens in the query
    media_reused: Mapping[MediaKind, int]  # query media items inside the prefix, per kind: not encoded again
    media_to_encode: Mapping[MediaKind, int]  # query media items after the prefix, per kind: still to encode
    cache_id: int = field(repr=False)  # which PrefixCache made this match


@dataclass(slots=True, eq=False)
class Lease:
    """Restored state at ``length``; hold it while the model uses it, then pass it to :meth:`PrefixCache.release`.

    Attention K/V in ``layers`` are views of cached tensors: the model may read them, never write into them.
    Recurrent state is a private copy.
    """

    namespace: Namespace  # namespace of the entry
    entry: EntryId  # entry the state comes from
    length: int  # tokens the state stands for
    layers: tuple[RestoredLayer, ...]  # one per layer, in the entry's layer order
    extra: Any  # the entry's extras value at ``length``
    extras_upto: tuple[tuple[int, Any], ...]  # the entry's extras steps with start <= ``length``, so that an entry
    # stored by the run that continues this lease can carry them on
    media: tuple[MediaSpan, ...]  # media items inside [0, length)
    snapshots_upto: tuple[Mapping[int, tuple[torch.Tensor, ...]] | None, ...]  # per recurrent layer: stored
    # snapshots at lengths <= length, by reference, so that a new entry can carry them on; None for other kinds
    cache_id: int = field(repr=False)  # which PrefixCache issued it
    released: bool = False  # set by release()


@dataclass(frozen=True, slots=True)
class PinResult:
    """What :meth:`PrefixCache.pin` did. A refused pin is a hint not taken: nothing changed."""

    pinned: bool  # the prefix is pinned now (made, or an existing pin renewed)
    length: int  # tokens of the prefix asked for
    reason: str | None = None  # why it was refused: "not_cached" (no entry restores this prefix at exactly this
    # length) or "over_share" (its entry would take the tenant's pinned bytes past its share of the device tier, or
    # all pinned bytes past the device budget); None when pinned
    expires_at: float | None = None  # clock time the pin lapses at unless used again; None when refused
    renewed: bool = False  # the prefix was pinned already: its expiry moved on


@dataclass(frozen=True, slots=True)
class PinInfo:
    """One live pin (:meth:`PrefixCache.pins`)."""

    namespace: Namespace
    length: int  # tokens of the pinned prefix
    ttl_s: float  # seconds it lasts after its last use
    expires_at: float  # clock time it lapses at unless used again
    entry: EntryId  # the entry that holds it


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int  # entries held
    in_use: int  # entries acquired and not yet released
    entries_per_tier: Mapping[str, int]  # "device" / "host" / "disk" -> entries (disk: entries held only on disk)
    bytes_per_tier: Mapping[str, int]  # "device" / "host" -> bytes of distinct storages; "disk" -> tensor bytes of
    # the files (entries in memory that also have a file included, entries of unused namespaces too)
    budget_per_tier: Mapping[str, int | None]  # byte budgets (None: unlimited; disk 0: no disk tier)
    lookups: int  # lookup() calls
    hits: int  # lookups that found a prefix
    query_tokens: int  # tokens looked up
    hit_tokens: int  # tokens served from the cache
    inserts: int  # insert() calls that added an entry
    redundant_inserts: int  # insert() calls covered by an existing entry (nothing added)
    offloads: int  # entries moved device -> host
    promotions: int  # entries moved host -> device on acquire
    evictions: int  # entries dropped for budget or by evict()
    superseded: int  # entries dropped because a newer entry serves all they serve
    spills: int = 0  # entries that left memory and stayed on the disk tier
    disk_reads: int = 0  # entries read back from disk
    disk_read_errors: int = 0  # entries dropped because their files were missing, corrupt or foreign when read
    disk_writes: int = 0  # entry files written
    disk_write_errors: int = 0  # entry files that could not be written (full, read-only, removed directory)
    disk_pending: int = 0  # entry files queued or being written
    disk_skipped_files: int = 0  # files found unusable at startup (unreadable, truncated, foreign, renamed)
    disk_healthy: bool | None = None  # None: no disk tier; False: unusable directory, or the last write failed
    bytes_per_tenant: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # tenant salt -> "device" /
    # "host" / "disk" -> bytes, for every tenant holding an entry (counted as in bytes_per_tier, per tenant; disk:
    # its entries' files, files of namespaces not used yet belong to nobody)
    tenant_share: float | None = None  # fraction of a tier's budget a tenant keeps while another needs room (None: off)
    pins: int = 0  # live pins
    pinned_entries: int = 0  # entries holding at least one pin (all on the device tier)
    pinned_bytes: int = 0  # bytes of those entries' distinct storages
    pins_made: int = 0  # pin() calls that pinned a prefix not pinned before
    pins_renewed: int = 0  # pin() calls on a prefix already pinned (its expiry moved on)
    pins_refused: int = 0  # pin() calls refused (not_cached or over_share)
    pins_expired: int = 0  # pins that lapsed (their TTL passed since their last use)
    pinned_per_tenant: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # tenant salt -> "pins" /
    # "entries" / "bytes" held now, "refused" / "expired" so far; for every tenant that pinned or asked to

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0
