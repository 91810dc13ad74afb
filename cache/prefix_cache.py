"""The prefix cache: insert a sequence's state, find the best prefix of a new sequence, restore it, release it.

Typical turn (single-threaded; the engine serialises calls)::

    match = cache.lookup(ns, tokens, media)          # longest servable prefix, or None; touches the entry
    lease = cache.acquire(match, ns) if match else None
    ... run the model on tokens[match.length:] starting from lease.layers ...
    cache.insert(ns, tokens + reply, layers, media=media, extras=extras)
    cache.release(lease)

Memory: two tiers, *device* (where the model runs) and *host* (CPU), each with a byte budget and one LRU order
(least recently used first; a hit, an insert and an acquire count as uses). Over the device budget the least
recently used idle entry is moved to the host tier; over the host budget the least recently used idle host entry is
dropped. Entries in use (acquired and not released) are never moved or dropped. Bytes are counted per distinct
tensor storage, so entries that share tensors are not counted twice within a tier.

Supersession: when a new entry serves every length that an older entry on its own path serves, the older entry is
dropped (or, if in use, dropped at its last release). A new entry that an existing one already covers is not kept.
"""

from __future__ import annotations

import itertools
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cache.errors import LayoutError, LeaseError, LengthError, NamespaceError
from cache.layers import (
    LayerState,
    NormalKV,
    RecurrentState,
    RestoredLayer,
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
from cache.radix import EntryId, RadixIndex

DEVICE = "device"
HOST = "host"
TIERS = (DEVICE, HOST)

Extras = Sequence[tuple[int, Any]]
"""Adapter state as a step function of length: ``((start, value), ...)``; the value at length ``n`` is the one with
the largest ``start <= n`` (None before the first). Example: the next mRoPE position offset after each media item."""

_cache_ids = itertools.count(1)


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
class CacheStats:
    entries: int  # entries held
    in_use: int  # entries acquired and not yet released
    entries_per_tier: Mapping[str, int]  # "device" / "host" -> entries
    bytes_per_tier: Mapping[str, int]  # "device" / "host" -> bytes of distinct storages
    budget_per_tier: Mapping[str, int | None]  # byte budgets (None: unlimited)
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

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


@dataclass(slots=True, eq=False)
class _Entry:
    eid: EntryId
    namespace: Namespace
    tokens: array  # the full token sequence (int64)
    layers: tuple[LayerState, ...]  # stored per-layer state
    media: tuple[MediaSpan, ...]  # sorted media spans
    extras: tuple[tuple[int, Any], ...]  # step function of adapter state
    tier: str  # DEVICE or HOST
    users: int = 0  # leases out
    superseded: bool = False  # drop at last release


class PrefixCache:
    """Prefix cache over many namespaces with device/host byte budgets. Not thread-safe."""

    def __init__(
        self,
        *,
        device_budget_bytes: int | None = None,
        host_budget_bytes: int | None = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        for name, value in (
            ("device_budget_bytes", device_budget_bytes),
            ("host_budget_bytes", host_budget_bytes),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise LengthError(f"{name} must be a non-negative integer or None, got {value!r}")
        self._id = next(_cache_ids)  # stamps matches and leases
        self._device = torch.device(device)  # where device-tier tensors live
        self._budgets: dict[str, int | None] = {DEVICE: device_budget_bytes, HOST: host_budget_bytes}
        self._indexes: dict[Namespace, RadixIndex] = {}  # one radix tree per namespace
        self._layouts: dict[Namespace, tuple] = {}  # layer signatures per namespace, from its first insert
        self._entries: dict[EntryId, _Entry] = {}  # every entry held
        self._lru: OrderedDict[EntryId, None] = OrderedDict()  # least -> most recently used
        self._storages: dict[str, dict[tuple, list[int]]] = {t: {} for t in TIERS}  # tier -> key -> [refs, bytes]
        self._tier_bytes: dict[str, int] = dict.fromkeys(TIERS, 0)  # bytes of distinct storages per tier
        self._ids = itertools.count(1)  # entry ids
        self._clock = itertools.count(1)  # recency ticks
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
            ),
            0,
        )

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
        is added). Entries on the new entry's path that it fully serves are dropped. Budgets are enforced after.

        Raises:
            TokenError, SpanError, LayoutError, LengthError, NamespaceError: bad input; the cache is unchanged.
        """
        if not isinstance(namespace, Namespace):
            raise NamespaceError(f"expected a Namespace, got {type(namespace).__name__}")
        token_list = check_tokens(tokens)
        length = len(token_list)
        spans = check_spans(media, length)
        layer_tuple = self._check_layers(namespace, layers, length)
        extra_tuple = _check_extras(extras, length)
        floor = SpanFloor(spans)
        lo, points = _servable(layer_tuple, floor)
        if lo is None and not points:
            raise LengthError("no length at which every layer of this entry can be restored")

        # -- validated: mutate from here on
        self._layouts.setdefault(namespace, tuple(signature(s) for s in layer_tuple))
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
        self._lru[eid] = None
        self._account(entry, +1)
        self._counters["inserts"] += 1
        for other_id in list(index.entries_on_path(eid)):
            if index.covers(eid, other_id, floor):
                other = self._entries[other_id]
                if other.users:
                    other.superseded = True
                else:
                    self._drop(other)
                    self._counters["superseded"] += 1
        self._enforce_budgets()
        return eid

    def lookup(
        self, namespace: Namespace, tokens: Iterable[int], media: Iterable[MediaSpan] = ()
    ) -> PrefixMatch | None:
        """The longest cached prefix of ``tokens`` that can be restored, leaving at least one token to compute.

        Side effects: counts the lookup; on a hit the entry becomes the most recently used.

        Raises:
            TokenError, SpanError: bad query; nothing is counted.
        """
        token_list = check_tokens(tokens)
        spans = check_spans(media, len(token_list))
        self._counters["lookups"] += 1
        self._counters["query_tokens"] += len(token_list)
        index = self._indexes.get(namespace)
        if index is None or len(token_list) < 2:
            return None
        floor = SpanFloor(spans)
        found = index.best(encode_keys(token_list, spans), len(token_list) - 1, floor)
        if found is None:
            return None
        length, eid = found
        entry = self._entries[eid]
        length = _exact_media_cut(entry.media, spans, length)
        if length < 1 or not index.servable(eid, length):
            return None  # a 62-bit media key collided; the exact check refused the hit
        self._touch(entry)
        self._counters["hits"] += 1
        self._counters["hit_tokens"] += length
        reused = {k: 0 for k in MediaKind}
        to_encode = {k: 0 for k in MediaKind}
        for span in spans:
            (reused if span.end <= length else to_encode)[span.kind] += 1
        return PrefixMatch(namespace, eid, length, len(token_list), reused, to_encode, self._id)

    def acquire(self, match: PrefixMatch, namespace: Namespace) -> Lease:
        """Restore the state of ``match`` for use by the model of ``namespace``. Release the lease when done.

        An entry on the host tier is moved back to the device tier first.

        Raises:
            NamespaceError: the match comes from another cache or another namespace.
            LeaseError: the matched entry has been dropped since the lookup.
        """
        if not isinstance(match, PrefixMatch) or match.cache_id != self._id:
            raise NamespaceError("this match was not made by this cache")
        if match.namespace != namespace:
            raise NamespaceError("this match belongs to another namespace")
        entry = self._entries.get(match.entry)
        if entry is None:
            raise LeaseError(f"entry {match.entry} was dropped after the lookup; look up again")
        if entry.tier == HOST:
            self._move(entry, DEVICE)
            self._counters["promotions"] += 1
        entry.users += 1
        self._touch(entry)
        n = match.length
        lease = Lease(
            namespace=entry.namespace,
            entry=entry.eid,
            length=n,
            layers=tuple(restore(state, n) for state in entry.layers),
            extra=_extra_at(entry.extras, n),
            extras_upto=tuple(step for step in entry.extras if step[0] <= n),
            media=spans_before(entry.media, n),
            snapshots_upto=tuple(
                {k: v for k, v in s.snapshots.items() if k <= n} if isinstance(s, RecurrentState) else None
                for s in entry.layers
            ),
            cache_id=self._id,
        )
        self._enforce_budgets()
        return lease

    def release(self, lease: Lease) -> None:
        """Give a lease back. A superseded entry is dropped at its last release.

        Raises:
            NamespaceError: the lease comes from another cache.
            LeaseError: the lease was already released.
        """
        if not isinstance(lease, Lease) or lease.cache_id != self._id:
            raise NamespaceError("this lease was not issued by this cache")
        if lease.released:
            raise LeaseError("this lease was already released")
        lease.released = True
        entry = self._entries[lease.entry]
        entry.users -= 1
        if entry.superseded and entry.users == 0:
            self._drop(entry)
            self._counters["superseded"] += 1
        self._enforce_budgets()

    def evict(self, bytes_to_free: int | None = None, namespace: Namespace | None = None) -> int:
        """Drop idle entries, least recently used first, until ``bytes_to_free`` bytes are freed (None: all idle
        entries). Restrict to one ``namespace`` if given. Returns the number of entries dropped."""
        if bytes_to_free is not None and (not isinstance(bytes_to_free, int) or bytes_to_free < 0):
            raise LengthError(f"bytes_to_free must be a non-negative integer or None, got {bytes_to_free!r}")
        dropped = 0
        start = sum(self._tier_bytes.values())
        for eid in list(self._lru):
            if bytes_to_free is not None and start - sum(self._tier_bytes.values()) >= bytes_to_free:
                break
            entry = self._entries[eid]
            if entry.users or (namespace is not None and entry.namespace != namespace):
                continue
            self._drop(entry)
            self._counters["evictions"] += 1
            dropped += 1
        return dropped

    def stats(self) -> CacheStats:
        per_tier = dict.fromkeys(TIERS, 0)
        for entry in self._entries.values():
            per_tier[entry.tier] += 1
        return CacheStats(
            entries=len(self._entries),
            in_use=sum(1 for e in self._entries.values() if e.users),
            entries_per_tier=per_tier,
            bytes_per_tier=dict(self._tier_bytes),
            budget_per_tier=dict(self._budgets),
            **self._counters,
        )

    def entry_ids(self) -> list[EntryId]:
        """Ids of the entries held, least recently used first."""
        return list(self._lru)

    def entry_tier(self, eid: EntryId) -> str:
        return self._entries[eid].tier

    def entry_length(self, eid: EntryId) -> int:
        return len(self._entries[eid].tokens)

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
        expected: dict[str, dict[tuple, list[int]]] = {t: {} for t in TIERS}
        for entry in self._entries.values():
            assert entry.users >= 0
            assert not entry.superseded or entry.users > 0, "an idle superseded entry was kept"
            for key, nbytes in _storages_of(entry):
                slot = expected[entry.tier].setdefault(key, [0, nbytes])
                slot[0] += 1
        assert expected == self._storages, "storage accounting drifted"
        for tier in TIERS:
            assert self._tier_bytes[tier] == sum(b for _, b in expected[tier].values())

    # ================================================================ helpers

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
        table = self._storages[entry.tier]
        for key, nbytes in _storages_of(entry):
            slot = table.get(key)
            if sign > 0:
                if slot is None:
                    table[key] = [1, nbytes]
                    self._tier_bytes[entry.tier] += nbytes
                else:
                    slot[0] += 1
            else:
                assert slot is not None
                slot[0] -= 1
                if slot[0] == 0:
                    del table[key]
                    self._tier_bytes[entry.tier] -= nbytes

    def _move(self, entry: _Entry, tier: str) -> None:
        target = torch.device("cpu") if tier == HOST else self._device
        self._account(entry, -1)
        entry.layers = tuple(moved(state, lambda t: t.to(target)) for state in entry.layers)
        entry.tier = tier
        self._account(entry, +1)

    def _drop(self, entry: _Entry) -> None:
        assert entry.users == 0
        index = self._indexes[entry.namespace]
        index.remove(entry.eid)
        del self._entries[entry.eid]
        del self._lru[entry.eid]
        self._account(entry, -1)
        if not len(index):
            del self._indexes[entry.namespace]
            del self._layouts[entry.namespace]

    def _enforce_budgets(self) -> None:
        device_budget, host_budget = self._budgets[DEVICE], self._budgets[HOST]
        if device_budget is not None and self._tier_bytes[DEVICE] > device_budget:
            for eid in list(self._lru):
                if self._tier_bytes[DEVICE] <= device_budget:
                    break
                entry = self._entries[eid]
                if entry.tier != DEVICE or entry.users:
                    continue
                if host_budget == 0:
                    self._drop(entry)
                    self._counters["evictions"] += 1
                else:
                    self._move(entry, HOST)
                    self._counters["offloads"] += 1
        if host_budget is not None and self._tier_bytes[HOST] > host_budget:
            for eid in list(self._lru):
                if self._tier_bytes[HOST] <= host_budget:
                    break
                entry = self._entries.get(eid)
                if entry is None or entry.tier != HOST or entry.users:
                    continue
                self._drop(entry)
                self._counters["evictions"] += 1


# ==================================================================== module helpers


def _storages_of(entry: _Entry) -> list[tuple[tuple, int]]:
    """Distinct storages of an entry's tensors: (key, bytes)."""
    out: dict[tuple, int] = {}
    for state in entry.layers:
        for t in tensors_of(state):
            storage = t.untyped_storage()
            out[(t.device.type, t.device.index, storage.data_ptr())] = storage.nbytes()
    return list(out.items())


def _servable(layers: tuple[LayerState, ...], floor: SpanFloor) -> tuple[int | None, tuple[int, ...]]:
    """(lo, ()) for an entry servable on ``[lo, T]``, or (None, points) for one servable only at ``points``."""
    lo = 0
    point_sets: list[set[int]] = []
    for state in layers:
        if isinstance(state, RotatingKV):
            lo = max(lo, state.shortest())
        elif isinstance(state, RecurrentState):
            point_sets.append(set(state.snapshots))
    if not point_sets:
        return lo, ()
    points = set.intersection(*point_sets)
    return None, tuple(sorted(p for p in points if p >= max(lo, 1) and floor(p) == p))


def _check_extras(extras: Extras, length: int) -> tuple[tuple[int, Any], ...]:
    out = tuple(extras)
    previous = -1
    for item in out:
        if not isinstance(item, tuple) or len(item) != 2:
            raise LengthError(f"extras must be (start, value) pairs, got {item!r}")
        start = item[0]
        if not isinstance(start, int) or start < 0 or start > length:
            raise LengthError(f"extras start {start!r} is outside [0, {length}]")
        if start <= previous:
            raise LengthError("extras starts must be strictly increasing")
        previous = start
    return out


def _extra_at(extras: tuple[tuple[int, Any], ...], n: int) -> Any:
    value = None
    for start, v in extras:
        if start > n:
            break
        value = v
    return value


def _exact_media_cut(stored: tuple[MediaSpan, ...], query: tuple[MediaSpan, ...], n: int) -> int:
    """``n``, or the start of the first span before ``n`` where stored and query media differ."""
    a, b = spans_before(stored, n), spans_before(query, n)
    for x, y in itertools.zip_longest(a, b):
        if x != y:
            starts = [s.start for s in (x, y) if s is not None]
            return min(starts)
    return n
