"""An entry of the prefix cache's map, and the distinct tensor storages it holds (what the policy counts)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from cache.disk import DiskRecord
from cache.layers import LayerState, tensors_of
from cache.media import MediaSpan
from cache.namespace import Namespace
from cache.radix import EntryId


@dataclass(slots=True, eq=False)
class Entry:
    """One entry of the map: its sequence, its state (or its file), its users."""

    eid: EntryId
    namespace: Namespace
    tokens: array  # the full token sequence (int64)
    layers: tuple[LayerState, ...] | None  # stored per-layer state; None while the entry is only on disk
    media: tuple[MediaSpan, ...]  # sorted media spans
    extras: tuple[tuple[int, Any], ...]  # step function of adapter state
    tier: str  # DEVICE, HOST or DISK
    disk: DiskRecord | None = None  # its file on the disk tier (written or queued), if any
    users: int = 0  # leases out
    superseded: bool = False  # drop when it is no longer in use nor pinned, if what superseded it is still held


def storages_of(entry: Entry) -> tuple[tuple[tuple, int], ...]:
    """Distinct storages of an entry's tensors: (key, bytes)."""
    out: dict[tuple, int] = {}
    for state in entry.layers or ():
        for t in tensors_of(state):
            storage = t.untyped_storage()
            out[(t.device.type, t.device.index, storage.data_ptr())] = storage.nbytes()
    return tuple(out.items())
