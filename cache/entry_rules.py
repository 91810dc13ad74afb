"""What an entry can serve, and the checks on its extras: pure functions over layer states, media spans and extras."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from cache.errors import LengthError
from cache.layers import LayerState, RecurrentState, RotatingKV
from cache.media import MediaSpan, SpanFloor, spans_before

Extras = Sequence[tuple[int, Any]]
"""Adapter state as a step function of length: ``((start, value), ...)``; the value at length ``n`` is the one with
the largest ``start <= n`` (None before the first). Example: the next mRoPE position offset after each media item."""


def servable_limits(layers: tuple[LayerState, ...]) -> tuple[int, list[set[int]]]:
    """The shortest length the rotating layers allow, and the snapshot lengths of each recurrent layer."""
    lo = 0
    point_sets: list[set[int]] = []
    for state in layers:
        if isinstance(state, RotatingKV):
            lo = max(lo, state.shortest())
        elif isinstance(state, RecurrentState):
            point_sets.append(set(state.snapshots))
    return lo, point_sets


def servable(lo: int, point_sets: list[set[int]], floor: SpanFloor) -> tuple[int | None, tuple[int, ...]]:
    """(lo, ()) for an entry servable on ``[lo, T]``, or (None, points) for one servable only at ``points``."""
    if not point_sets:
        return lo, ()
    points = set.intersection(*point_sets)
    return None, tuple(sorted(p for p in points if p >= max(lo, 1) and floor(p) == p))


def check_extras(extras: Extras, length: int) -> tuple[tuple[int, Any], ...]:
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


def extra_at(extras: tuple[tuple[int, Any], ...], n: int) -> Any:
    value = None
    for start, v in extras:
        if start > n:
            break
        value = v
    return value


def exact_media_cut(stored: tuple[MediaSpan, ...], query: tuple[MediaSpan, ...], n: int) -> int:
    """``n``, or the start of the first span before ``n`` where stored and query media differ."""
    a, b = spans_before(stored, n), spans_before(query, n)
    for x, y in itertools.zip_longest(a, b):
        if x != y:
            starts = [s.start for s in (x, y) if s is not None]
            return min(starts)
    return n
