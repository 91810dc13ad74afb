"""The prefix cache: insert a sequence's state, find the best prefix of a new sequence, restore it, release it.

Typical turn (single-threaded; the engine serialises calls)::

    match = cache.lookup(ns, tokens, media)          # longest servable prefix, or None; touches the entry
    lease = cache.acquire(match, ns) if match else None
    ... run the model on tokens[match.length:] starting from lease.layers ...
    cache.insert(ns, tokens + reply, layers, media=media, extras=extras)
    cache.release(lease)

Memory: three tiers, *device* (where the model runs), *host* (CPU) and *disk* (files, optional), each with a byte
budget, and one LRU order over all entries (least recently used first; a hit, an insert and an acquire count as
uses). Over the device budget the least recently used idle device entry moves to the host tier (or leaves memory
when the host budget is 0); over the host budget the least recently used idle host entry leaves memory. An entry
that leaves memory stays on the disk tier if it has a file there, else it is dropped. Over the disk budget the least
recently used idle entry loses its file (and is dropped if that was its only copy). Entries in use (acquired and not
released) are never moved or dropped. Memory bytes are counted per distinct tensor storage, so entries that share
tensors are not counted twice within a tier; disk bytes are the tensor bytes of each entry's files.

Tenant shares (``tenant_share=s``, off by default): a tenant is a namespace salt; it is *over its share* of a tier when
it holds more than ``floor(s * budget)`` bytes there while another tenant holds bytes there too (alone, a tenant may
fill a tier). Over a tier's budget its idle entries leave in this order: those that cannot fit the tier at all beside
the entries in use; then entries of tenants over their share, first those that cannot fit within the share beside
their tenant's entries in use; then any; each group least recently used first across all the tenants concerned (not
"the most over tenant first"), each entry judged when its turn comes. So no tenant within its share loses an entry
from a tier while another is over its share there with an idle entry. With one tenant, or shares off, this is the
plain order above. :meth:`PrefixCache.stats` reports bytes per tenant and tier.

Disk tier (``disk_dir`` and ``disk_budget_bytes > 0``): every new entry is queued for writing when it is stored and
written behind the model, not through it: ``disk_write_delay_s`` later (an entry superseded meanwhile, as a chat's
next turn supersedes its last, is never written), and while the model computes (:meth:`PrefixCache.defer_disk_writes`)
at most ``disk_write_defer_s`` later than that; a killed process loses the writes still queued. A hit on an entry
that is only on disk reads it back, and a new cache on the same directory finds the entries of earlier runs (see
:mod:`cache.disk`). Call :meth:`PrefixCache.close` at shutdown to wait, for a bounded time, until the files are
written (a flush writes everything queued at once).

Pins (:meth:`PrefixCache.pin`): a prefix held for a TTL after its last use, on the entry that restores it, which
is then treated as an entry in use (it stays on the device tier and is never dropped) until the pin lapses; an entry
that supersedes it takes the pin over. A tenant's pinned bytes are bounded by its share of the device budget (all of
it with shares off), all pinned bytes by that budget: a pin beyond is refused (a hint not taken). Time comes from the
``clock`` given to the cache; lapsed pins are released at the start of every call.

Supersession: when a new entry serves every length that an older entry on its own path serves, the older entry is
dropped (or, if in use, at its last release), but only while the new entry is still held in some tier: an insert
whose entry cannot be held within the budgets drops nothing as superseded, and an entry released after what
superseded it was evicted is kept (with shares on and two tenants held, "can be held" includes fitting its tenant's
share). A new entry that an existing one already covers is not kept.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cache.disk import DEFER_S, WRITE_DELAY_S, DiskRecord, DiskTier
from cache.disk_format import DEFAULT_CHUNK_TOKENS, DiskFormatError, namespace_digest, signatures_digest
from cache.entry_rules import Extras, check_extras, exact_media_cut, extra_at, servable, servable_limits
from cache.errors import CacheError, LayoutError, LeaseError, LengthError, NamespaceError
from cache.evictions import EvictionRecord
from cache.layers import (
    LayerState,
    NormalKV,
    RecurrentState,
    RotatingKV,
    Stateless,
    attention_dtype,
    layer_length,
    moved,
    restore,
    signature,
    tensors_of,
)
from cache.media import (
    MediaKind,
    MediaSpan,
    SpanFloor,
    check_spans,
    check_tokens,
    encode_keys,
    spans_before,
)
from cache.namespace import Namespace
from cache.pins import PinTable, prefix_digest
from cache.radix import EntryId, RadixIndex
from cache.records import CacheStats, Lease, PinInfo, PinResult, PrefixMatch
from cache.tenants import StorageCounts, TenantBytes, share_limit
from cache.tiers import DEVICE, DISK, HOST, MEMORY_TIERS, TIERS

log = logging.getLogger("turncache.cache")

_cache_ids = itertools.count(1)


@dataclass(slots=True, eq=False)
class _Entry:
    eid: EntryId
    namespace: Namespace
    tokens: array  # the full token sequence (int64)
    layers: tuple[LayerState, ...] | None  # stored per-layer state; None while the entry is only on disk
    media: tuple[MediaSpan, ...]  # sorted media spans
    extras: tuple[tuple[int, Any], ...]  # step function of adapter state
    tier: str  # DEVICE, HOST or DISK
    disk: DiskRecord | None = None  # its file on the disk tier (written or queued), if any
    mem_bytes: int = 0  # bytes of its distinct storages while in memory (shared ones counted in full)
    users: int = 0  # leases out
    superseded: bool = False  # drop when it is no longer in use nor pinned, if what superseded it is still held


class PrefixCache:
    """Prefix cache over many namespaces with device / host / disk byte budgets. Not thread-safe."""

    def __init__(
        self,
        *,
        device_budget_bytes: int | None = None,
        host_budget_bytes: int | None = 0,
        device: str | torch.device = "cpu",
        disk_dir: str | os.PathLike | None = None,
        disk_budget_bytes: int = 0,
        disk_chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        disk_write_delay_s: float = WRITE_DELAY_S,
        disk_write_defer_s: float = DEFER_S,
        tenant_share: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``disk_dir`` with ``disk_budget_bytes > 0`` turns the disk tier on: entries of earlier runs found there
        are served (their tensors read on first use). ``disk_chunk_tokens``: rows per shared chunk file.
        ``disk_write_delay_s`` / ``disk_write_defer_s``: a queued file is written no sooner than this after its
        entry was stored, and waits at most that much longer while :meth:`defer_disk_writes` says the model
        computes (see :mod:`cache.disk`).
        ``tenant_share`` (in (0, 1]; None: off): the fraction of each tier's budget that one tenant (namespace salt)
        keeps while another tenant holds bytes in that tier (see the module docstring). ``clock``: seconds, for pins'
        expiries (tests step one by hand).

        Raises:
            LengthError: a negative budget or chunk size, or a tenant share outside (0, 1].
        """
        for name, value in (
            ("device_budget_bytes", device_budget_bytes),
            ("host_budget_bytes", host_budget_bytes),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise LengthError(f"{name} must be a non-negative integer or None, got {value!r}")
        if not isinstance(disk_budget_bytes, int) or disk_budget_bytes < 0:
            raise LengthError(f"disk_budget_bytes must be a non-negative integer, got {disk_budget_bytes!r}")
        if not isinstance(disk_chunk_tokens, int) or disk_chunk_tokens < 1:
            raise LengthError(f"disk_chunk_tokens must be a positive integer, got {disk_chunk_tokens!r}")
        for name, value in (("disk_write_delay_s", disk_write_delay_s), ("disk_write_defer_s", disk_write_defer_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise LengthError(f"{name} must be a finite non-negative number, got {value!r}")
        if tenant_share is not None and (
            isinstance(tenant_share, bool) or not isinstance(tenant_share, int | float) or not 0 < tenant_share <= 1
        ):
            raise LengthError(f"tenant_share must be a number in (0, 1] or None, got {tenant_share!r}")
        self._id = next(_cache_ids)  # stamps matches and leases
        self._device = torch.device(device)  # where device-tier tensors live
        self._disk: DiskTier | None = None  # the disk tier; None when off
        if disk_dir is not None and disk_budget_bytes > 0:
            self._disk = DiskTier(
                disk_dir,
                disk_budget_bytes,
                chunk_tokens=disk_chunk_tokens,
                write_delay_s=disk_write_delay_s,
                defer_s=disk_write_defer_s,
            )
        self._budgets: dict[str, int | None] = {
            DEVICE: device_budget_bytes,
            HOST: host_budget_bytes,
            DISK: disk_budget_bytes if self._disk is not None else 0,
        }
        self._indexes: dict[Namespace, RadixIndex] = {}  # one radix tree per namespace
        self._layouts: dict[Namespace, tuple] = {}  # layer signatures per namespace, from its first insert
        self._entries: dict[EntryId, _Entry] = {}  # every entry held
        self._leased: dict[EntryId, _Entry] = {}  # entries in use or pinned (all on the device tier): never moved
        self._pins = PinTable()  # live pins and their holders
        self._pin_tally: dict[str, dict[str, int]] = {}  # tenant salt -> "refused" / "expired" pins so far
        self._clock_fn = clock  # seconds, for pins' expiries
        self._lru: OrderedDict[EntryId, None] = OrderedDict()  # least -> most recently used
        self._storages: dict[str, StorageCounts] = {t: StorageCounts() for t in MEMORY_TIERS}  # distinct storages
        # of each memory tier
        self._tier_bytes: dict[str, int] = dict.fromkeys(TIERS, 0)  # bytes per tier (see CacheStats)
        self._share: float | None = None if tenant_share is None else float(tenant_share)  # fraction of a tier's
        # budget a tenant keeps while another holds bytes there; None: shares off
        self._tenants = TenantBytes()  # entries and bytes per tenant (salt) and tier
        self._evicted = EvictionRecord()  # key prefixes of recently evicted entries (see `evicted_reach`)
        self._ns_digests: dict[Namespace, str] = {}  # namespace -> the digest its files carry; a namespace is in
        # here once it adopted the files of earlier runs
        self._ids = itertools.count(1)  # entry ids
        self._clock = itertools.count(1)  # recency ticks
        self._oldest = 0  # recency below every entry's: entries found on disk are given recencies under it
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "lookups",
                "hits",
                "query_tokens",
                "hit_tokens",
                "inserts",
                "redundant_inserts",
                "offloads",
                "promotions",
                "evictions",
                "superseded",
                "spills",
                "pins_made",
                "pins_renewed",
                "pins_refused",
                "pins_expired",
            ),
            0,
        )
        if self._disk is not None:
            self._tier_bytes[DISK] = self._disk.dormant_bytes
            self._enforce_disk_budget()

    # ================================================================ public API

    def insert(
        self,
        namespace: Namespace,
        tokens: Iterable[int],
        layers: Sequence[LayerState],
        *,
        media: Iterable[MediaSpan] = (),
        extras: Extras = (),
    ) -> EntryId:
        """Store the state of ``tokens`` and return the id of an entry that serves it.

        That is the new entry, or an existing one that already serves every length the new one would (then nothing
        is added). With a disk tier the new entry's files are queued. If the budgets can hold the new entry in some
        tier, the entries on its path that it fully serves are dropped (at their last release if in use); then
        budgets are enforced.

        Raises:
            TokenError, SpanError, LayoutError, LengthError, NamespaceError: bad input; the cache is unchanged.
        """
        if not isinstance(namespace, Namespace):
            raise NamespaceError(f"expected a Namespace, got {type(namespace).__name__}")
        token_list = check_tokens(tokens)
        length = len(token_list)
        spans = check_spans(media, length)
        layer_tuple = self._check_layers(namespace, layers, length)
        extra_tuple = check_extras(extras, length)
        floor = SpanFloor(spans)
        lo, points = servable(*servable_limits(layer_tuple), floor)
        if lo is None and not points:
            raise LengthError("no length at which every layer of this entry can be restored")

        # -- validated: mutate from here on
        self._collect_disk()
        self._expire()
        self._adopt(namespace)
        if namespace not in self._layouts:
            self._layouts[namespace] = tuple(signature(s) for s in layer_tuple)
            self._drop_other_layouts(namespace)
        index = self._indexes.setdefault(namespace, RadixIndex())
        keys = encode_keys(token_list, spans)
        covering = index.covering(keys, lo, points, floor)
        if covering is not None:
            self._counters["redundant_inserts"] += 1
            self._touch(self._entries[covering])
            return covering
        eid = next(self._ids)
        entry = _Entry(eid, namespace, array("q", token_list), layer_tuple, spans, extra_tuple, DEVICE)
        index.add(eid, keys, lo, points, next(self._clock))
        self._entries[eid] = entry
        self._tenants.add_entry(namespace.salt)
        self._lru[eid] = None
        self._account(entry, +1)
        self._counters["inserts"] += 1
        self._persist(entry, keys)
        covered = [other for other in index.entries_on_path(eid) if index.covers(eid, other, floor)]
        if covered and self._survives(entry):
            for other_id in covered:
                other = self._entries[other_id]
                if self._pins.move(other_id, eid):  # the new entry serves every pinned prefix the old one did
                    self._leased[eid] = entry
                if other.users:
                    other.superseded = True
                else:
                    self._leased.pop(other_id, None)
                    self._drop(other)
                    self._counters["superseded"] += 1
        self._enforce_budgets()
        return eid

    def lookup(
        self, namespace: Namespace, tokens: Iterable[int], media: Iterable[MediaSpan] = ()
    ) -> PrefixMatch | None:
        """The longest cached prefix of ``tokens`` that can be restored, leaving at least one token to compute.

        Side effects: counts the lookup; on a hit the entry becomes the most recently used. An entry held only on
        disk is read back into the device tier, then the budgets are enforced without moving that entry out of it
        (the acquire that follows would bring it back, and what it pushed out would be lost for nothing), so the
        device tier may stay over its budget by that entry until the next operation; one whose files turn out
        unreadable is dropped with a warning and the next best prefix is looked up.

        Raises:
            TokenError, SpanError: bad query; nothing is counted.
        """
        token_list = check_tokens(tokens)
        spans = check_spans(media, len(token_list))
        self._collect_disk()
        self._expire()
        self._counters["lookups"] += 1
        self._counters["query_tokens"] += len(token_list)
        self._adopt(namespace)
        if len(token_list) < 2:
            return None
        floor = SpanFloor(spans)
        keys = encode_keys(token_list, spans)
        while True:
            index = self._indexes.get(namespace)
            if index is None:
                return None
            found = index.best(keys, len(token_list) - 1, floor)
            if found is None:
                return None
            length, eid = found
            entry = self._entries[eid]
            length = exact_media_cut(entry.media, spans, length)
            if length < 1 or not index.servable(eid, length):
                return None  # a 62-bit media key collided; the exact check refused the hit
            if entry.tier != DISK:
                self._touch(entry)
                break
            if self._read_back(entry):  # else it was dropped: look again
                self._touch(entry)
                self._enforce_budgets(spare=entry)  # the acquire that follows would only bring it back
                break
        self._counters["hits"] += 1
        self._counters["hit_tokens"] += length
        if self._pins.holds(eid):
            now = self._clock_fn()
            for pin in self._pins.held_by(eid):
                if pin.length <= length:  # this hit restores the pinned prefix: a use
                    self._pins.refresh(pin, now)
        reused = {k: 0 for k in MediaKind}
        to_encode = {k: 0 for k in MediaKind}
        for span in spans:
            (reused if span.end <= length else to_encode)[span.kind] += 1
        return PrefixMatch(namespace, eid, length, len(token_list), reused, to_encode, self._id)

    def reach(self, namespace: Namespace, tokens: Iterable[int], media: Iterable[MediaSpan] = ()) -> tuple[int, bool]:
        """How far ``tokens`` follow some sequence cached in ``namespace`` (servable or not), and whether a cached
        sequence goes on past that point with another token. For reporting why a lookup stopped where it did; no
        side effects (nothing counted, no entry touched, nothing read back from disk).

        Raises:
            TokenError, SpanError: bad query.
        """
        token_list = check_tokens(tokens)
        spans = check_spans(media, len(token_list))
        index = self._indexes.get(namespace)
        if index is None:
            return 0, False
        return index.reach(encode_keys(token_list, spans))

    def evicted_reach(self, namespace: Namespace, tokens: Iterable[int], media: Iterable[MediaSpan] = ()) -> int:
        """How far ``tokens`` (in whole blocks of ``cache.evictions.BLOCK``) follow an entry of ``namespace`` that was
        evicted recently (a bounded record, oldest forgotten first). For reporting that a longer match was held and
        evicted; no side effects.

        Raises:
            TokenError, SpanError: bad query.
        """
        token_list = check_tokens(tokens)
        spans = check_spans(media, len(token_list))
        return self._evicted.reach(namespace, encode_keys(token_list, spans))

    def acquire(self, match: PrefixMatch, namespace: Namespace) -> Lease:
        """Restore the state of ``match`` for use by the model of ``namespace``. Release the lease when done.

        An entry on the host tier is moved back to the device tier first; one only on disk is read back.

        Raises:
            NamespaceError: the match comes from another cache or another namespace.
            LeaseError: the matched entry has been dropped since the lookup, or could not be read back from disk.
        """
        if not isinstance(match, PrefixMatch) or match.cache_id != self._id:
            raise NamespaceError("this match was not made by this cache")
        if match.namespace != namespace:
            raise NamespaceError("this match belongs to another namespace")
        self._collect_disk()
        self._expire()
        entry = self._entries.get(match.entry)
        if entry is None:
            raise LeaseError(f"entry {match.entry} was dropped after the lookup; look up again")
        if entry.tier == DISK and not self._read_back(entry):
            raise LeaseError(f"entry {match.entry} could not be read back from disk; look up again")
        if entry.tier == HOST:
            self._move(entry, DEVICE)
            self._counters["promotions"] += 1
        entry.users += 1
        self._leased[entry.eid] = entry
        self._touch(entry)
        n = match.length
        layers = entry.layers
        assert layers is not None
        lease = Lease(
            namespace=entry.namespace,
            entry=entry.eid,
            length=n,
            layers=tuple(restore(state, n) for state in layers),
            extra=extra_at(entry.extras, n),
            extras_upto=tuple(step for step in entry.extras if step[0] <= n),
            media=spans_before(entry.media, n),
            snapshots_upto=tuple(
                {k: v for k, v in s.snapshots.items() if k <= n} if isinstance(s, RecurrentState) else None
                for s in layers
            ),
            cache_id=self._id,
        )
        self._enforce_budgets()
        return lease

    def release(self, lease: Lease) -> None:
        """Give a lease back. A superseded entry is dropped at its last release if an entry that serves all it
        serves is still held (in any tier); otherwise it stays, as an ordinary entry.

        Raises:
            NamespaceError: the lease comes from another cache.
            LeaseError: the lease was already released.
        """
        if not isinstance(lease, Lease) or lease.cache_id != self._id:
            raise NamespaceError("this lease was not issued by this cache")
        if lease.released:
            raise LeaseError("this lease was already released")
        self._collect_disk()
        self._expire()
        lease.released = True
        entry = self._entries[lease.entry]
        entry.users -= 1
        self._settle(entry)
        self._enforce_budgets()

    def pin(
        self,
        namespace: Namespace,
        tokens: Iterable[int],
        length: int,
        ttl_s: float,
        *,
        media: Iterable[MediaSpan] = (),
    ) -> PinResult:
        """Hold the prefix ``tokens[:length]`` of ``namespace`` for ``ttl_s`` seconds after its last use.

        The pin lives on the most recently used entry that restores that prefix at exactly ``length`` (read back if
        only on disk, moved to the device tier if on the host tier), which is then treated as an entry in use: never
        moved out of the device tier, never dropped, until the pin lapses; an entry that supersedes it takes the pin
        over. Pinning a prefix already pinned renews it (never refused). A new pin is refused, as a hint not taken,
        when no entry restores the prefix at exactly ``length`` (``not_cached``) or when its entry would take the
        tenant's pinned bytes past its share of the device budget (the whole budget with shares off), or all pinned
        bytes past the device budget (``over_share``). A lookup hit at ``length`` or beyond on the holder is a use.

        Raises:
            TokenError, SpanError, LengthError, NamespaceError: bad input; nothing changed.
        """
        if not isinstance(namespace, Namespace):
            raise NamespaceError(f"expected a Namespace, got {type(namespace).__name__}")
        token_list = check_tokens(tokens)
        spans = check_spans(media, len(token_list))
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= len(token_list):
            raise LengthError(f"length must be an integer in [1, {len(token_list)}], got {length!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s < math.inf:
            raise LengthError(f"ttl_s must be a positive finite number of seconds, got {ttl_s!r}")
        self._collect_disk()
        self._expire()
        self._adopt(namespace)
        now = self._clock_fn()
        keys = encode_keys(token_list, spans)[:length]
        key = (namespace, prefix_digest(keys))
        existing = self._pins.get(key)
        if existing is not None:
            self._pins.refresh(existing, now, float(ttl_s))
            self._touch(self._entries[existing.holder])
            self._counters["pins_renewed"] += 1
            return PinResult(True, length, None, existing.expires, renewed=True)
        entry = self._pin_holder(namespace, keys, spans, length)
        reason = "not_cached" if entry is None else None
        if entry is not None and not self._pin_fits(entry):
            reason = "over_share"
        if reason is not None:
            self._counters["pins_refused"] += 1
            self._tally(namespace.salt, "refused")
            self._enforce_budgets()  # a holder read back from disk for nothing may go again
            return PinResult(False, length, reason)
        assert entry is not None
        if entry.tier == HOST:
            self._move(entry, DEVICE)
            self._counters["promotions"] += 1
        pin = self._pins.add(key, length, float(ttl_s), now, entry.eid)
        self._leased[entry.eid] = entry
        self._touch(entry)
        self._counters["pins_made"] += 1
        self._enforce_budgets()
        return PinResult(True, length, None, pin.expires)

    def pins(self) -> list[PinInfo]:
        """The live pins, oldest first."""
        self._expire()
        return [
            PinInfo(pin.key[0], pin.length, pin.ttl, pin.expires, pin.holder)  # type: ignore[arg-type]
            for pin in sorted(self._pins, key=lambda p: p.number)
        ]

    def expire_pins(self) -> int:
        """Release the pins whose time has passed (every other call does this first too). Returns how many."""
        return self._expire()

    def evict(self, bytes_to_free: int | None = None, namespace: Namespace | None = None) -> int:
        """Drop idle entries, least recently used first, with their files, until ``bytes_to_free`` bytes are freed
        over all tiers (None: all idle entries). Restrict to one ``namespace`` if given. Returns the number of
        entries dropped."""
        if bytes_to_free is not None and (not isinstance(bytes_to_free, int) or bytes_to_free < 0):
            raise LengthError(f"bytes_to_free must be a non-negative integer or None, got {bytes_to_free!r}")
        self._collect_disk()
        self._expire()
        dropped = 0
        start = sum(self._tier_bytes.values())
        for eid in list(self._lru):
            if bytes_to_free is not None and start - sum(self._tier_bytes.values()) >= bytes_to_free:
                break
            entry = self._entries[eid]
            if eid in self._leased or (namespace is not None and entry.namespace != namespace):
                continue
            self._evict(entry)
            dropped += 1
        return dropped

    def defer_disk_writes(self, busy: bool) -> None:
        """Say whether the model is computing (``busy``): the disk tier's writes wait while it is, at most
        ``disk_write_defer_s`` past their due time, and go on once it has been idle a moment. Unlike every other
        method, safe from any thread (it only signals the writer); cheap. No-op without a disk tier."""
        if self._disk is not None and self._disk.usable:
            self._disk.defer(busy)

    def flush(self, timeout: float | None = None) -> bool:
        """Queue a file for every entry held in memory that has none (most recently used first), then wait at most
        ``timeout`` seconds until every queued file is written. Returns True when all are (or there is no disk
        tier)."""
        if self._disk is None:
            return True
        self._collect_disk()
        for eid in reversed(self._lru):
            entry = self._entries[eid]
            if entry.tier != DISK and entry.disk is None:
                self._persist(entry, encode_keys(entry.tokens, entry.media))
        self._enforce_disk_budget()
        done = self._disk.flush(timeout)
        self._collect_disk()
        return done

    def close(self, timeout: float | None = 10.0) -> bool:
        """At shutdown: :meth:`flush` within ``timeout`` seconds, then stop the disk writer. The cache keeps working
        in memory afterwards, but writes nothing more. Returns True when every file was written."""
        if self._disk is None:
            return True
        done = self.flush(timeout)
        self._disk.close(0.0 if not done else timeout)
        return done

    def stats(self) -> CacheStats:
        self._collect_disk()
        self._expire()
        per_tier = dict.fromkeys(TIERS, 0)
        for entry in self._entries.values():
            per_tier[entry.tier] += 1
        disk = self._disk.snapshot_counters() if self._disk is not None else {}
        return CacheStats(
            entries=len(self._entries),
            in_use=len(self._leased),
            entries_per_tier=per_tier,
            bytes_per_tier=dict(self._tier_bytes),
            budget_per_tier=dict(self._budgets),
            **self._counters,
            disk_reads=disk.get("reads", 0),
            disk_read_errors=disk.get("read_errors", 0),
            disk_writes=disk.get("writes", 0),
            disk_write_errors=disk.get("write_errors", 0),
            disk_pending=self._disk.pending if self._disk is not None else 0,
            disk_skipped_files=disk.get("skipped_files", 0),
            disk_healthy=self._disk.healthy if self._disk is not None else None,
            bytes_per_tenant=self._tenants.per_tenant(),
            tenant_share=self._share,
            pins=len(self._pins),
            pinned_entries=len(self._pins.holders()),
            pinned_bytes=sum(_storages_union(self._pinned()).values()),
            pinned_per_tenant=self._pinned_per_tenant(),
        )

    def entry_ids(self) -> list[EntryId]:
        """Ids of the entries held, least recently used first."""
        return list(self._lru)

    def entry_tier(self, eid: EntryId) -> str:
        return self._entries[eid].tier

    def entry_has_file(self, eid: EntryId) -> bool:
        """Whether the entry has a file on the disk tier (written or queued)."""
        return self._entries[eid].disk is not None

    def check_invariants(self) -> None:
        """Raise AssertionError if any internal structure disagrees with another. For tests."""
        indexed: set[EntryId] = set()
        for ns, index in self._indexes.items():
            index.check()
            for eid in self._entries:
                if self._entries[eid].namespace == ns:
                    assert eid in index, f"entry {eid} missing from its index"
                    entry = self._entries[eid]
                    assert index.path_keys(eid) == encode_keys(entry.tokens, entry.media), "path != tokens"
                    indexed.add(eid)
            assert len(index) == sum(1 for e in self._entries.values() if e.namespace == ns)
        assert indexed == set(self._entries), "entries and indexes disagree"
        assert list(self._lru) == sorted(self._lru, key=lambda i: self._recency(i)), "LRU out of order"
        assert set(self._lru) == set(self._entries), "LRU and entries disagree"
        busy = {e.eid for e in self._entries.values() if e.users or self._pins.holds(e.eid)}
        assert set(self._leased) == busy, "entries in use or pinned disagree"
        self._pins.check()
        for pin in self._pins:
            holder = self._entries.get(pin.holder)
            assert holder is not None and holder.tier == DEVICE, "a pin's holder is gone or off the device tier"
            assert holder.namespace == pin.key[0], "a pin's holder is in another namespace"
            index = self._indexes[holder.namespace]
            assert index.servable(holder.eid, pin.length), "a pin's holder cannot restore its prefix"
            assert spans_before(holder.media, pin.length) == tuple(s for s in holder.media if s.end <= pin.length), (
                "a pinned prefix ends inside a media item"
            )
            keys = encode_keys(holder.tokens, holder.media)
            assert prefix_digest(keys[: pin.length]) == pin.key[1], "a pin's holder has another prefix"
        expected = {t: StorageCounts() for t in MEMORY_TIERS}
        tenants = TenantBytes()
        disk_bytes = self._disk.dormant_bytes if self._disk is not None else 0
        for entry in self._entries.values():
            tenants.add_entry(entry.namespace.salt)
            assert entry.users >= 0
            assert not entry.superseded or entry.eid in self._leased, "an idle superseded entry was kept"
            assert (entry.layers is None) == (entry.tier == DISK), "tensors and tier disagree"
            assert entry.tier != DISK or (entry.disk is not None and entry.eid not in self._leased), (
                "disk entry without a file, or in use"
            )
            if entry.disk is not None:
                assert self._disk is not None and entry.disk.eid == entry.eid
                disk_bytes += entry.disk.nbytes
                tenants.add_file(entry.namespace.salt, entry.disk.nbytes)
            if entry.tier == DISK:
                continue
            expected[entry.tier].add(_storages_of(entry))
            tenants.add_storages(entry.tier, entry.namespace.salt, _storages_of(entry))
        assert expected == self._storages, "storage accounting drifted"
        for tier in MEMORY_TIERS:
            assert self._tier_bytes[tier] == sum(b for _, b in expected[tier].refs.values())
        assert self._tier_bytes[DISK] == disk_bytes, "disk accounting drifted"
        assert tenants == self._tenants, "per-tenant accounting drifted"
        self._evicted.check()

    # ================================================================ helpers: pins

    def _expire(self) -> int:
        """Release the pins whose time has passed; their holders become idle unless used or pinned otherwise. Then
        the budgets are enforced (once, after every lapsed pin is released)."""
        if not len(self._pins):
            return 0
        due = self._pins.due(self._clock_fn())
        if not due:
            return 0
        self._counters["pins_expired"] += len(due)
        for pin in due:
            self._tally(pin.key[0].salt, "expired")  # type: ignore[attr-defined]
            entry = self._entries.get(pin.holder)
            if entry is not None:
                self._settle(entry)
        self._enforce_budgets()
        return len(due)

    def _settle(self, entry: _Entry) -> None:
        """``entry`` may have gone idle (a lease released, a pin lapsed): if so it leaves the busy set, and a
        superseded one is dropped if an entry that serves all it serves is held."""
        if entry.users or self._pins.holds(entry.eid):
            return
        self._leased.pop(entry.eid, None)
        if entry.superseded:
            entry.superseded = False
            if self._indexes[entry.namespace].covered_by_other(entry.eid, SpanFloor(entry.media)):
                self._drop(entry)
                self._counters["superseded"] += 1

    def _pin_holder(
        self, namespace: Namespace, keys: array, spans: tuple[MediaSpan, ...], length: int
    ) -> _Entry | None:
        """The most recently used entry that restores ``keys`` (a prefix's) at exactly ``length``, in memory (read
        back from disk if need be); None if there is none."""
        floor = SpanFloor(spans)
        if floor(length) != length:
            return None  # inside a media item: nothing can be restored there
        while True:
            index = self._indexes.get(namespace)
            if index is None:
                return None
            found = index.best(keys, length, floor)
            if found is None or found[0] != length:
                return None
            entry = self._entries[found[1]]
            if exact_media_cut(entry.media, spans, length) != length:
                return None  # a 62-bit media key collided
            if entry.tier != DISK or self._read_back(entry):
                return entry

    def _pin_fits(self, entry: _Entry) -> bool:
        """Whether pinning ``entry`` keeps its tenant's pinned bytes within its share of the device budget (all of
        it with shares off) and all pinned bytes within that budget."""
        budget = self._budgets[DEVICE]
        if budget is None or entry.eid in self._pins.holders():
            return True
        pinned = self._pinned()
        salt = entry.namespace.salt
        own = [e for e in pinned if e.namespace.salt == salt]
        limit = share_limit(self._share if self._share is not None else 1.0, budget)
        assert limit is not None
        return (
            sum(_storages_union([*own, entry]).values()) <= limit
            and sum(_storages_union([*pinned, entry]).values()) <= budget
        )

    def _pinned(self) -> list[_Entry]:
        """The entries holding pins."""
        return [self._entries[eid] for eid in sorted(self._pins.holders())]

    def _tally(self, salt: str, what: str) -> None:
        counts = self._pin_tally.setdefault(salt, {"refused": 0, "expired": 0})
        counts[what] += 1

    def _pinned_per_tenant(self) -> dict[str, dict[str, int]]:
        by_salt: dict[str, list[_Entry]] = {salt: [] for salt in self._pin_tally}
        for entry in self._pinned():
            by_salt.setdefault(entry.namespace.salt, []).append(entry)
        out: dict[str, dict[str, int]] = {}
        for salt, entries in sorted(by_salt.items()):
            out[salt] = {
                "pins": sum(self._pins.holds(e.eid) for e in entries),
                "entries": len(entries),
                "bytes": sum(_storages_union(entries).values()),
                **self._pin_tally.get(salt, {"refused": 0, "expired": 0}),
            }
        return out

    # ================================================================ helpers: entries

    def _recency(self, eid: EntryId) -> int:
        entry = self._entries[eid]
        return self._indexes[entry.namespace].recency_of(eid)

    def _touch(self, entry: _Entry) -> None:
        self._indexes[entry.namespace].touch(entry.eid, next(self._clock))
        self._lru.move_to_end(entry.eid)

    def _check_layers(self, namespace: Namespace, layers: Sequence[LayerState], length: int) -> tuple[LayerState, ...]:
        states = tuple(layers)
        if not states:
            raise LayoutError("an entry needs at least one layer state")
        devices = set()
        for i, state in enumerate(states):
            if not isinstance(state, NormalKV | RotatingKV | RecurrentState | Stateless):
                raise LayoutError(f"layer {i}: unknown state type {type(state).__name__}")
            own = layer_length(state)
            if isinstance(state, RecurrentState):
                if own > length:
                    raise LengthError(f"layer {i}: snapshot at {own} is beyond the sequence length {length}")
                if length not in state.snapshots:
                    raise LengthError(f"layer {i}: recurrent layers need a snapshot at the entry's length {length}")
            elif own is not None and own != length:
                raise LengthError(f"layer {i}: holds state for {own} tokens, the sequence has {length}")
            dtype = attention_dtype(state)
            if dtype is not None and str(dtype).removeprefix("torch.") != namespace.dtype:
                raise LayoutError(f"layer {i}: K/V dtype {dtype} differs from the namespace dtype {namespace.dtype}")
            devices.update(t.device for t in tensors_of(state))
        if len(devices) > 1:
            raise LayoutError(f"layer states lie on several devices: {sorted(map(str, devices))}")
        known = self._layouts.get(namespace)
        if known is not None:
            if len(known) != len(states):
                raise LayoutError(f"namespace has {len(known)} layers, this entry has {len(states)}")
            for i, (want, state) in enumerate(zip(known, states, strict=True)):
                if signature(state) != want:
                    raise LayoutError(f"layer {i}: {signature(state)} does not match the namespace's {want}")
        return states

    def _account(self, entry: _Entry, sign: int) -> None:
        """Count (``sign`` > 0) or stop counting the storages of ``entry`` in its memory tier, for the tier and for
        its tenant."""
        tier, salt = entry.tier, entry.namespace.salt
        storages = _storages_of(entry)
        if sign > 0:
            entry.mem_bytes = sum(nbytes for _, nbytes in storages)
            self._tier_bytes[tier] += self._storages[tier].add(storages)
            self._tenants.add_storages(tier, salt, storages)
        else:
            self._tier_bytes[tier] -= self._storages[tier].remove(storages)
            self._tenants.remove_storages(tier, salt, storages)

    def _move(self, entry: _Entry, tier: str) -> None:
        """Between the memory tiers."""
        assert entry.layers is not None and tier in MEMORY_TIERS
        target = torch.device("cpu") if tier == HOST else self._device
        self._account(entry, -1)
        entry.layers = tuple(moved(state, lambda t: t.to(target)) for state in entry.layers)
        entry.tier = tier
        self._account(entry, +1)

    def _evict(self, entry: _Entry) -> None:
        """Drop ``entry`` for room (or a lost file), remembering its key prefix (``evicted_reach``)."""
        self._evicted.record(entry.namespace, self._indexes[entry.namespace].path_keys(entry.eid))
        self._drop(entry)
        self._counters["evictions"] += 1

    def _drop(self, entry: _Entry) -> None:
        assert entry.users == 0 and not self._pins.holds(entry.eid)
        index = self._indexes[entry.namespace]
        index.remove(entry.eid)
        del self._entries[entry.eid]
        self._tenants.remove_entry(entry.namespace.salt)
        del self._lru[entry.eid]
        if entry.tier != DISK:
            self._account(entry, -1)
        if entry.disk is not None:
            self._unpersist(entry)
        if not len(index):
            del self._indexes[entry.namespace]
            self._layouts.pop(entry.namespace, None)

    def _survives(self, entry: _Entry) -> bool:
        """Whether enforcing the budgets now would keep ``entry`` in some tier: it must fit beside the entries in
        use on the device tier, or alone on the host tier, or its file beside theirs on disk (while writes work).
        With tenant shares on and another tenant's entry held, it must also fit its tenant's share of that tier
        beside its tenant's entries in use there, or the share rule could push it out."""
        return (
            self._keeps(entry, DEVICE)
            or (self._budgets[HOST] != 0 and self._keeps(entry, HOST))
            or (entry.disk is not None and self._disk is not None and self._disk.healthy and self._keeps(entry, DISK))
        )

    def _keeps(self, entry: _Entry, tier: str) -> bool:
        """``_survives`` for one tier."""
        if self._too_big(entry, tier):
            return False
        limit = self._share_limit(tier)
        if limit is None or self._tenants.tenants() < 2:
            return True
        return self._fits(entry, tier, limit, self._in_use_of(entry.namespace.salt))

    def _too_big(self, entry: _Entry, tier: str, leased: dict[tuple, int] | None = None) -> bool:
        """Whether ``entry`` cannot be held in ``tier`` even with every other idle entry gone from it (the entries
        in use stay: they are all on the device tier). ``leased``: their storages, if the caller has them."""
        budget = self._budgets[tier]
        return budget is not None and not self._fits(entry, tier, budget, tuple(self._leased.values()), leased)

    def _fits(
        self,
        entry: _Entry,
        tier: str,
        limit: int,
        in_use: Collection[_Entry],
        in_use_storages: dict[tuple, int] | None = None,
    ) -> bool:
        """Whether ``entry`` fits in ``limit`` bytes of ``tier`` beside the entries ``in_use`` (all on the device
        tier) and nothing else. ``in_use_storages``: their storages, if the caller has them."""
        if tier == DISK:
            assert entry.disk is not None
            files = sum(e.disk.nbytes for e in in_use if e.disk is not None and e is not entry)
            return entry.disk.nbytes + files <= limit
        if tier == HOST or not in_use:
            return entry.mem_bytes <= limit
        if in_use_storages is None:
            in_use_storages = _storages_union(in_use)
        if entry.mem_bytes + sum(in_use_storages.values()) <= limit:
            return True
        return sum({**in_use_storages, **dict(_storages_of(entry))}.values()) <= limit

    def _in_use_of(self, salt: str) -> tuple[_Entry, ...]:
        """The entries in use of one tenant."""
        return tuple(e for e in self._leased.values() if e.namespace.salt == salt)

    def _share_limit(self, tier: str) -> int | None:
        """Bytes of ``tier`` a tenant keeps while another holds bytes there; None: shares off or no budget."""
        return share_limit(self._share, self._budgets[tier])

    def _enforce_budgets(self, spare: _Entry | None = None) -> None:
        """Over a tier's budget, its idle entries go until it is back under: first those that cannot fit there at
        all, then those of tenants over their share (:meth:`_over_share_order`), then the least recently used.
        device -> host (or out of memory when the host budget is 0 or too small for the entry alone), host -> out of
        memory (the disk tier if the entry has a file, else dropped), and on disk the file goes (with the entry if
        that was its only copy). ``spare``: an idle entry that stays in memory this time (a lookup's read-back, about
        to be acquired); its file may still go."""
        for tier in MEMORY_TIERS:
            budget = self._budgets[tier]
            if budget is None or self._tier_bytes[tier] <= budget:
                continue
            lru = map(self._entries.__getitem__, self._lru)
            idle = [e for e in lru if e.tier == tier and e.eid not in self._leased and e is not spare]
            leased = _storages_union(self._leased.values()) if tier == DEVICE else None
            too_big = [e for e in idle if self._too_big(e, tier, leased)]
            for entry in itertools.chain(too_big, self._over_share_order(tier, idle), idle):
                if self._tier_bytes[tier] <= budget:
                    break
                if not self._holds(entry, tier):
                    continue  # moved or dropped already in this pass
                if tier == DEVICE and self._budgets[HOST] != 0 and not self._too_big(entry, HOST):
                    self._move(entry, HOST)
                    self._counters["offloads"] += 1
                else:
                    self._leave_memory(entry)
        self._enforce_disk_budget()

    def _over_share_order(self, tier: str, idle: list[_Entry]) -> Iterator[_Entry]:
        """With shares on: the entries of ``idle`` (least recently used first) still in ``tier`` whose tenant is
        over its share there, first those that cannot fit within the share beside their tenant's entries in use,
        then the others, each group least recently used first. Lazy: each entry is judged when the caller asks for
        it, after the one before it has gone. A tenant's bytes in a tier only fall while the tier's budget is
        enforced, so a tenant found not over its share stays so, and one scan per group suffices."""
        limit = self._share_limit(tier)
        if limit is None or self._tenants.tenants() < 2:
            return
        in_use: dict[str, list[_Entry]] = {}
        for entry in self._leased.values():
            in_use.setdefault(entry.namespace.salt, []).append(entry)
        in_use_storages = {salt: _storages_union(entries) for salt, entries in in_use.items()}

        def beyond_share(entry: _Entry) -> bool:
            salt = entry.namespace.salt
            return not self._fits(entry, tier, limit, in_use.get(salt, ()), in_use_storages.get(salt))

        beyond = [e for e in idle if self._holds(e, tier) and beyond_share(e)]
        for group in (beyond, idle):
            for entry in group:
                if self._holds(entry, tier) and self._tenants.over_share(tier, entry.namespace.salt, limit):
                    yield entry

    def _holds(self, entry: _Entry, tier: str) -> bool:
        """Whether ``entry`` is still held in ``tier`` (for the disk tier: has a file)."""
        if entry.eid not in self._entries:
            return False
        return entry.disk is not None if tier == DISK else entry.tier == tier

    # ================================================================ helpers: the disk tier

    def _leave_memory(self, entry: _Entry) -> None:
        """Over the memory budgets: keep ``entry`` on the disk tier if it has (or can get) a file, else drop it. No
        file is tried while disk writes fail: the entry would wait in the writer's queue only to be dropped."""
        if entry.disk is None and self._disk is not None and self._disk.healthy:
            self._persist(entry, encode_keys(entry.tokens, entry.media))
        if entry.disk is None:
            self._evict(entry)
            return
        self._account(entry, -1)
        entry.layers = None
        entry.tier = DISK
        self._counters["spills"] += 1

    def _enforce_disk_budget(self) -> None:
        disk = self._disk
        budget = self._budgets[DISK]
        if disk is None or self._tier_bytes[DISK] <= budget:
            return
        lru = map(self._entries.__getitem__, self._lru)
        idle = [e for e in lru if e.disk is not None and e.eid not in self._leased]
        too_big = [e for e in idle if self._too_big(e, DISK)]
        for entry in too_big:
            self._lose_file(entry)
        while self._tier_bytes[DISK] > budget and disk.has_dormant:  # files of earlier runs nobody asked for yet
            self._tier_bytes[DISK] -= disk.drop_oldest_dormant()
        for entry in itertools.chain(self._over_share_order(DISK, idle), idle):
            if self._tier_bytes[DISK] <= budget:
                break
            if self._holds(entry, DISK):
                self._lose_file(entry)

    def _lose_file(self, entry: _Entry) -> None:
        if entry.tier == DISK:
            self._evict(entry)
        else:
            self._unpersist(entry)

    def _persist(self, entry: _Entry, keys: array) -> None:
        """Queue ``entry``'s files, if the disk tier is on and they fit its budget at all."""
        disk = self._disk
        if disk is None or not disk.writable or entry.layers is None:
            return
        ns_digest = self._ns_digest(entry.namespace)
        record = disk.plan(ns_digest, entry.tokens, entry.media, entry.extras, entry.layers, keys)
        if record is None or record.nbytes > self._budgets[DISK]:
            return
        record.eid = entry.eid
        disk.write(record, entry.layers)
        entry.disk = record
        self._tier_bytes[DISK] += record.nbytes
        self._tenants.add_file(entry.namespace.salt, record.nbytes)

    def _unpersist(self, entry: _Entry) -> None:
        assert self._disk is not None and entry.disk is not None
        self._disk.delete(entry.disk)
        self._tier_bytes[DISK] -= entry.disk.nbytes
        self._tenants.remove_file(entry.namespace.salt, entry.disk.nbytes)
        entry.disk = None

    def _collect_disk(self) -> None:
        """Take in the outcomes of finished writes: an entry whose write failed has no file (and is dropped if that
        file was its only copy)."""
        if self._disk is None:
            return
        for record, error in self._disk.completions():
            if error is None or record.eid is None:
                continue
            entry = self._entries.get(record.eid)
            if entry is None or entry.disk is not record:
                continue  # dropped meanwhile
            self._unpersist(entry)
            if entry.tier == DISK:
                self._evict(entry)

    def _read_back(self, entry: _Entry) -> bool:
        """Load an entry held only on disk into the device tier. On failure, drop it and return False."""
        assert self._disk is not None and entry.disk is not None and entry.tier == DISK
        try:
            layers = self._disk.load(entry.disk)
            layers = self._check_layers(entry.namespace, layers, len(entry.tokens))
        except (DiskFormatError, CacheError) as exc:
            if isinstance(exc, CacheError):
                log.warning("prefix cache: dropping a disk entry that does not fit its namespace: %s", exc)
            self._drop(entry)
            return False
        entry.layers = tuple(moved(state, lambda t: t.to(self._device)) for state in layers)
        entry.tier = DEVICE
        self._account(entry, +1)
        return True

    def _ns_digest(self, namespace: Namespace) -> str:
        digest = self._ns_digests.get(namespace)
        if digest is None:
            digest = self._ns_digests[namespace] = namespace_digest(namespace)
        return digest

    def _adopt(self, namespace: Namespace) -> None:
        """Index the files that earlier runs left for ``namespace`` (on its first use), as its oldest entries."""
        if self._disk is None or not self._disk.has_dormant or namespace in self._ns_digests:
            return
        records = self._disk.adopt(self._ns_digest(namespace))
        if not records:
            return
        index = self._indexes.setdefault(namespace, RadixIndex())
        known = self._layouts.get(namespace)
        want = None if known is None else signatures_digest(known)
        adopted: list[EntryId] = []
        recency = self._oldest - len(records)
        self._oldest = recency
        for record in records:  # oldest first, recencies ascending
            recency += 1
            header = record.header
            floor = SpanFloor(header.media)
            try:
                lo, points = servable(*header.limits(), floor)
            except DiskFormatError as exc:
                lo, points = None, ()
                log.warning("prefix cache: skipping disk entry %s: %s", record.name, exc)
            if (lo is None and not points) or (want is not None and header.layout != want):
                self._disk.delete(record)
                self._tier_bytes[DISK] -= record.nbytes
                continue
            eid = next(self._ids)
            record.eid = eid
            entry = _Entry(eid, namespace, header.tokens, None, header.media, header.extras, DISK, record)
            index.add(eid, encode_keys(header.tokens, header.media), lo, points, recency)
            self._entries[eid] = entry
            self._tenants.add_entry(namespace.salt)
            self._tenants.add_file(namespace.salt, record.nbytes)
            adopted.append(eid)
        for eid in reversed(adopted):  # before every other entry in the LRU order, oldest first
            self._lru[eid] = None
            self._lru.move_to_end(eid, last=False)
        if not len(index):
            del self._indexes[namespace]

    def _drop_other_layouts(self, namespace: Namespace) -> None:
        """The first insert fixed ``namespace``'s layout: drop idle entries read from disk that do not have it."""
        index = self._indexes.get(namespace)
        if index is None:
            return
        want = self._layouts[namespace]
        for entry in [e for e in self._entries.values() if e.namespace == namespace and e.eid not in self._leased]:
            if entry.layers is not None:
                fits = tuple(signature(s) for s in entry.layers) == want
            else:
                fits = entry.disk is not None and entry.disk.header.layout == signatures_digest(want)
            if not fits:
                log.warning("prefix cache: dropping a disk entry whose layers do not fit the model's")
                self._drop(entry)
                self._layouts[namespace] = want  # _drop forgets the layout when the index empties


# ==================================================================== module helpers


def _storages_union(entries: Iterable[_Entry]) -> dict[tuple, int]:
    """Distinct storages of several entries' tensors: key -> bytes."""
    out: dict[tuple, int] = {}
    for entry in entries:
        out.update(_storages_of(entry))
    return out


def _storages_of(entry: _Entry) -> list[tuple[tuple, int]]:
    """Distinct storages of an entry's tensors: (key, bytes)."""
    out: dict[tuple, int] = {}
    for state in entry.layers or ():
        for t in tensors_of(state):
            storage = t.untyped_storage()
            out[(t.device.type, t.device.index, storage.data_ptr())] = storage.nbytes()
    return list(out.items())
