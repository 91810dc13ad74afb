"""The prefix cache's disk tier, the map's side: queue, drop and collect an entry's files, read an entry back,
adopt the files of earlier runs, flush and close (part of :class:`cache.PrefixCache`, split off by length; the files
themselves are :mod:`cache.disk`, what the disk tier admits and evicts :mod:`cache.policy`). See cache/DESIGN.md,
*The disk tier*."""

from __future__ import annotations

import itertools
import logging
from array import array

import torch

from cache.disk import DiskTier
from cache.disk_format import DiskFormatError, namespace_digest, signatures_digest
from cache.entry_rules import servable
from cache.errors import CacheError
from cache.layers import moved, signature
from cache.map_entry import Entry, storages_of
from cache.media import SpanFloor, encode_keys
from cache.namespace import Namespace
from cache.policy import TierPolicy
from cache.radix import EntryId, RadixIndex
from cache.tiers import DEVICE, DISK

log = logging.getLogger("turncache.cache")


class DiskEntries:
    """The map's entries on the disk tier. Mixed into :class:`cache.PrefixCache`, whose state it uses."""

    _disk: DiskTier | None
    _device: torch.device
    _entries: dict[EntryId, Entry]
    _indexes: dict[Namespace, RadixIndex]
    _layouts: dict[Namespace, tuple]
    _leased: dict[EntryId, Entry]
    _ns_digests: dict[Namespace, str]
    _policy: TierPolicy
    _counters: dict[str, int]
    _ids: itertools.count
    _oldest: int

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
        for eid in list(self._policy.reversed_order()):
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

    # ================================================================ helpers: the disk tier

    def _leave_memory(self, entry: Entry) -> None:
        """Over the memory budgets: keep ``entry`` on the disk tier if it has (or can get) a file, else drop it. No
        file is tried while disk writes fail: the entry would wait in the writer's queue only to be dropped."""
        if entry.disk is None and self._disk is not None and self._disk.healthy:
            self._persist(entry, encode_keys(entry.tokens, entry.media))
        if entry.disk is None:
            self._evict(entry)
            return
        entry.layers = None
        entry.tier = DISK
        self._policy.placed(entry.eid, DISK)
        self._counters["spills"] += 1

    def _lose_file(self, entry: Entry) -> None:
        if entry.tier == DISK:
            self._evict(entry)
        else:
            self._unpersist(entry)

    def _persist(self, entry: Entry, keys: array) -> None:
        """Queue ``entry``'s files, if the disk tier is on and they fit its budget at all."""
        disk = self._disk
        if disk is None or not disk.writable or entry.layers is None:
            return
        ns_digest = self._ns_digest(entry.namespace)
        record = disk.plan(ns_digest, entry.tokens, entry.media, entry.extras, entry.layers, keys)
        if record is None or not self._policy.admits_file(record.nbytes):
            return
        record.eid = entry.eid
        disk.write(record, entry.layers)
        entry.disk = record
        self._policy.filed(entry.eid, record.nbytes)

    def _unpersist(self, entry: Entry) -> None:
        assert self._disk is not None and entry.disk is not None
        self._disk.delete(entry.disk)
        entry.disk = None
        self._policy.filed(entry.eid, None)

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

    def _read_back(self, entry: Entry) -> bool:
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
        self._policy.placed(entry.eid, DEVICE, storages_of(entry))
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
        self._policy.dormant(self._disk.dormant_bytes, self._disk.has_dormant)
        if not records:
            return
        index = self._indexes.setdefault(namespace, RadixIndex())
        known = self._layouts.get(namespace)
        want = None if known is None else signatures_digest(known)
        adopted: list[tuple[EntryId, int]] = []
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
                continue
            eid = next(self._ids)
            record.eid = eid
            entry = Entry(eid, namespace, header.tokens, None, header.media, header.extras, DISK, record)
            index.add(eid, encode_keys(header.tokens, header.media), lo, points, recency)
            self._entries[eid] = entry
            adopted.append((eid, record.nbytes))
        for eid, nbytes in reversed(adopted):  # before every other entry in the LRU order, oldest first
            self._policy.added(eid, namespace.salt, DISK, (), nbytes, oldest=True)
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
