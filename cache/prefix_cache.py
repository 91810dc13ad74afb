"""The prefix cache: insert a sequence's state, find the best prefix of a new sequence, restore it, release it.

Typical turn (single-threaded; the engine serialises calls)::

    match = cache.lookup(ns, tokens, media)          # longest servable prefix, or None; touches the entry
    lease = cache.acquire(match, ns) if match else None
    ... run the model on tokens[match.length:] starting from lease.layers ...
    cache.insert(ns, tokens + reply, layers, media=media, extras=extras)
    cache.release(lease)

The map lives here: entries, one radix index per namespace, layouts, leases, pins' holders, and the tensors' moves
between tiers. What to keep where is decided by the policy (:mod:`cache.policy`: byte budgets per tier, tenant
shares, the eviction order, what the disk tier admits), which the map keeps told of every entry added, used, moved,
filed, busy or removed, and asks which entries leave which tier now. The disk tier's files are handled by
:mod:`cache.map_disk` and pins by :mod:`cache.map_pins` (parts of this class, split off by length); the rules are in
cache/DESIGN.md.

Supersession: when a new entry serves every length that an older entry on its own path serves, the older entry is
dropped (or, if in use, at its last release), but only while the new entry is still held in some tier
(:meth:`cache.policy.TierPolicy.survives`). A new entry that an existing one already covers is not kept.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from cache.disk import DEFER_S, WRITE_DELAY_S, DiskTier
from cache.disk_format import DEFAULT_CHUNK_TOKENS
from cache.entry_rules import Extras, check_extras, exact_media_cut, extra_at, servable, servable_limits
from cache.errors import LayoutError, LeaseError, LengthError, NamespaceError
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
from cache.map_disk import DiskEntries
from cache.map_entry import Entry, storages_of
from cache.map_pins import PinOps
from cache.media import MediaKind, MediaSpan, SpanFloor, check_spans, check_tokens, encode_keys, spans_before
from cache.namespace import Namespace
from cache.pins import PinTable, prefix_digest
from cache.policy import DROP_DORMANT, LEAVE_MEMORY, LOSE_FILE, OFFLOAD, Eviction, Fact, TierPolicy
from cache.radix import EntryId, RadixIndex
from cache.records import CacheStats, Lease, PrefixMatch
from cache.tiers import DEVICE, DISK, HOST, MEMORY_TIERS, TIERS

log = logging.getLogger("turncache.cache")

_cache_ids = itertools.count(1)


class PrefixCache(DiskEntries, PinOps):
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
        budgets = {
            DEVICE: device_budget_bytes,
            HOST: host_budget_bytes,
            DISK: disk_budget_bytes if self._disk is not None else 0,
        }
        share = None if tenant_share is None else float(tenant_share)
        self._policy = TierPolicy(budgets, share)  # budgets, shares, the LRU order, bytes per tier and tenant
        self._indexes: dict[Namespace, RadixIndex] = {}  # one radix tree per namespace
        self._layouts: dict[Namespace, tuple] = {}  # layer signatures per namespace, from its first insert
        self._entries: dict[EntryId, Entry] = {}  # every entry held
        self._leased: dict[EntryId, Entry] = {}  # entries in use or pinned (all on the device tier): never moved
        self._pins = PinTable()  # live pins and their holders
        self._pin_tally: dict[str, dict[str, int]] = {}  # tenant salt -> "refused" / "expired" pins so far
        self._clock_fn = clock  # seconds, for pins' expiries
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
            self._policy.dormant(self._disk.dormant_bytes, self._disk.has_dormant)
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
        entry = Entry(eid, namespace, array("q", token_list), layer_tuple, spans, extra_tuple, DEVICE)
        index.add(eid, keys, lo, points, next(self._clock))
        self._entries[eid] = entry
        self._policy.added(eid, namespace.salt, DEVICE, storages_of(entry))
        self._counters["inserts"] += 1
        self._persist(entry, keys)
        covered = [other for other in index.entries_on_path(eid) if index.covers(eid, other, floor)]
        if covered and self._policy.survives(eid, disk_healthy=self._disk is not None and self._disk.healthy):
            for other_id in covered:
                other = self._entries[other_id]
                if self._pins.move(other_id, eid):  # the new entry serves every pinned prefix the old one did
                    self._set_busy(entry, True)
                if other.users:
                    other.superseded = True
                else:
                    self._set_busy(other, False)
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
        self._set_busy(entry, True)
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

    def evict(self, bytes_to_free: int | None = None, namespace: Namespace | None = None) -> int:
        """Drop idle entries, least recently used first, with their files, until ``bytes_to_free`` bytes are freed
        over all tiers (None: all idle entries). Restrict to one ``namespace`` if given. Returns the number of
        entries dropped."""
        if bytes_to_free is not None and (not isinstance(bytes_to_free, int) or bytes_to_free < 0):
            raise LengthError(f"bytes_to_free must be a non-negative integer or None, got {bytes_to_free!r}")
        self._collect_disk()
        self._expire()
        dropped = 0
        start = self._policy.total_bytes()
        for eid in self._policy.order():
            if bytes_to_free is not None and start - self._policy.total_bytes() >= bytes_to_free:
                break
            entry = self._entries[eid]
            if eid in self._leased or (namespace is not None and entry.namespace != namespace):
                continue
            self._evict(entry)
            dropped += 1
        return dropped

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
            bytes_per_tier=self._policy.tier_bytes(),
            budget_per_tier=dict(self._policy.budgets),
            **self._counters,
            disk_reads=disk.get("reads", 0),
            disk_read_errors=disk.get("read_errors", 0),
            disk_writes=disk.get("writes", 0),
            disk_write_errors=disk.get("write_errors", 0),
            disk_pending=self._disk.pending if self._disk is not None else 0,
            disk_skipped_files=disk.get("skipped_files", 0),
            disk_healthy=self._disk.healthy if self._disk is not None else None,
            bytes_per_tenant=self._policy.per_tenant(),
            tenant_share=self._policy.share,
            pins=len(self._pins),
            pinned_entries=len(self._pins.holders()),
            pinned_bytes=self._policy.storage_bytes(sorted(self._pins.holders())),
            pinned_per_tenant=self._pinned_per_tenant(),
        )

    def entry_ids(self) -> list[EntryId]:
        """Ids of the entries held, least recently used first."""
        return self._policy.order()

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
        order = self._policy.order()
        assert order == sorted(order, key=lambda i: self._recency(i)), "LRU out of order"
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
        facts = []
        for entry in self._entries.values():
            assert entry.users >= 0
            assert not entry.superseded or entry.eid in self._leased, "an idle superseded entry was kept"
            assert (entry.layers is None) == (entry.tier == DISK), "tensors and tier disagree"
            assert entry.tier != DISK or (entry.disk is not None and entry.eid not in self._leased), (
                "disk entry without a file, or in use"
            )
            assert entry.disk is None or (self._disk is not None and entry.disk.eid == entry.eid)
            file_bytes = None if entry.disk is None else entry.disk.nbytes
            busy_now = entry.eid in self._leased
            facts.append(Fact(entry.eid, entry.namespace.salt, entry.tier, storages_of(entry), file_bytes, busy_now))
        self._policy.check(facts, self._disk.dormant_bytes if self._disk is not None else 0)
        self._evicted.check()

    # ================================================================ helpers: entries

    def _recency(self, eid: EntryId) -> int:
        entry = self._entries[eid]
        return self._indexes[entry.namespace].recency_of(eid)

    def _touch(self, entry: Entry) -> None:
        self._indexes[entry.namespace].touch(entry.eid, next(self._clock))
        self._policy.used(entry.eid)

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

    def _set_busy(self, entry: Entry, busy: bool) -> None:
        """``entry`` is in use or pinned (never moved nor dropped), or no longer."""
        if busy:
            self._leased[entry.eid] = entry
        else:
            self._leased.pop(entry.eid, None)
        self._policy.set_busy(entry.eid, busy)

    def _move(self, entry: Entry, tier: str) -> None:
        """Between the memory tiers."""
        assert entry.layers is not None and tier in MEMORY_TIERS
        target = torch.device("cpu") if tier == HOST else self._device
        entry.layers = tuple(moved(state, lambda t: t.to(target)) for state in entry.layers)
        entry.tier = tier
        self._policy.placed(entry.eid, tier, storages_of(entry))

    def _evict(self, entry: Entry) -> None:
        """Drop ``entry`` for room (or a lost file), remembering its key prefix (``evicted_reach``)."""
        self._evicted.record(entry.namespace, self._indexes[entry.namespace].path_keys(entry.eid))
        self._drop(entry)
        self._counters["evictions"] += 1

    def _drop(self, entry: Entry) -> None:
        assert entry.users == 0 and not self._pins.holds(entry.eid)
        index = self._indexes[entry.namespace]
        index.remove(entry.eid)
        del self._entries[entry.eid]
        if entry.disk is not None:
            self._unpersist(entry)
        self._policy.removed(entry.eid)
        if not len(index):
            del self._indexes[entry.namespace]
            self._layouts.pop(entry.namespace, None)

    def _enforce_budgets(self, spare: Entry | None = None) -> None:
        """Carry out what the policy says leaves which tier now (:meth:`TierPolicy.evictions`). ``spare``: an idle
        entry that stays in memory this time (a lookup's read-back, about to be acquired); its file may still go."""
        self._carry_out(self._policy.evictions(None if spare is None else spare.eid))

    def _enforce_disk_budget(self) -> None:
        self._carry_out(self._policy.disk_evictions())

    def _carry_out(self, evictions: Iterator[Eviction]) -> None:
        """Do each eviction, telling the policy what changed, before asking for the next."""
        for eviction in evictions:
            if eviction.action == DROP_DORMANT:
                assert self._disk is not None
                self._disk.drop_oldest_dormant()
                self._policy.dormant(self._disk.dormant_bytes, self._disk.has_dormant)
                continue
            assert eviction.eid is not None
            entry = self._entries[eviction.eid]
            if eviction.action == OFFLOAD:
                self._move(entry, HOST)
                self._counters["offloads"] += 1
            elif eviction.action == LEAVE_MEMORY:
                self._leave_memory(entry)
            else:
                assert eviction.action == LOSE_FILE
                self._lose_file(entry)
