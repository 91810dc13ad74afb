"""Property test: the radix-indexed cache agrees with the linear-scan reference on random workloads.

Random sequences share prefixes (each new one extends or edits an earlier one), carry media spans, and go into
namespaces whose layouts mix normal, rotating, recurrent and stateless layers; budgets are small enough that offload
and eviction happen. After every step ``check_invariants()`` must hold and both caches must agree on every answer,
on which entries they hold and on which tier each one is.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import MediaKind, MediaSpan, Namespace, PrefixCache
from tests.cache.helpers import nbytes, normal, recurrent, rotating, stateless
from tests.cache.reference import ReferenceCache

LAYOUTS = ("normal", "rotating", "recurrent", "rotating+recurrent", "stateless")
WINDOW = 3


def build(layout: str, length: int, data) -> tuple[list, int, set[int] | None]:
    """Layers for a sequence of ``length`` tokens, and what the reference needs: rotating lo, recurrent points."""
    lo, points = 0, None
    layers = []
    if layout in ("rotating", "rotating+recurrent"):
        rows = data.draw(st.integers(min(length, WINDOW - 1), length), label="rows")
        layer = rotating(length, WINDOW, rows)
        layers.append(layer)
        lo = layer.shortest()
    if layout in ("recurrent", "rotating+recurrent"):
        points = set(data.draw(st.sets(st.integers(1, length)), label="snapshots")) | {length}
        layers.append(recurrent(points))
    if layout in ("normal", "rotating", "recurrent"):
        layers.append(normal(length))
    if layout == "stateless":
        layers = [stateless(), normal(length)]
    return layers, lo, points


@st.composite
def sequences(draw, earlier: list):
    """A token sequence with media, often sharing a prefix with an earlier one."""
    if earlier and draw(st.booleans()):
        base_tokens, base_media = draw(st.sampled_from(earlier))
        cut = draw(st.integers(0, len(base_tokens)))
        tokens = list(base_tokens[:cut])
        media = [s for s in base_media if s.end <= cut]
    else:
        tokens, media = [], []
    tail = draw(st.lists(st.integers(1, 3), min_size=1 if not tokens else 0, max_size=6))
    start = len(tokens)
    tokens += tail
    if len(tail) >= 2 and draw(st.booleans()):  # a media item inside the new tail
        a = draw(st.integers(start, len(tokens) - 2))
        b = draw(st.integers(a + 1, len(tokens)))
        tokens[a:b] = [50] * (b - a)
        kind = draw(st.sampled_from([MediaKind.IMAGE, MediaKind.AUDIO]))
        media.append(MediaSpan(a, b, kind, draw(st.sampled_from(["h1", "h2"]))))
    if not tokens:
        tokens = [1]
    return tokens, media


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cache_agrees_with_linear_reference(data):
    namespaces = [Namespace("m", "float32"), Namespace("m", "float32", salt="t2")]
    layouts = {ns: data.draw(st.sampled_from(LAYOUTS), label="layout") for ns in namespaces}
    unit = nbytes([normal(6)])
    device_budget = data.draw(st.sampled_from([None, 4 * unit, 10 * unit]), label="device budget")
    host_budget = data.draw(st.sampled_from([0, None, 6 * unit]), label="host budget")
    real = PrefixCache(device_budget_bytes=device_budget, host_budget_bytes=host_budget)
    ref = ReferenceCache(device_budget, host_budget)
    seen: list = []
    leases: list = []

    for _ in range(data.draw(st.integers(5, 30), label="steps")):
        op = data.draw(st.sampled_from(["insert", "insert", "lookup", "lookup", "release", "evict"]), label="op")
        ns = data.draw(st.sampled_from(namespaces), label="namespace")
        if op == "insert":
            tokens, media = data.draw(sequences(seen), label="sequence")
            layers, lo, points = build(layouts[ns], len(tokens), data)
            before = set(ref.entries)
            eid = real.insert(ns, tokens, layers, media=media)
            served, added = ref.insert(eid, ns, tokens, media, lo, points, nbytes(layers))
            assert served == eid and added == (eid not in before)
            seen.append((tokens, media))
        elif op == "lookup":
            tokens, media = data.draw(sequences(seen), label="query")
            match = real.lookup(ns, tokens, media)
            expected = ref.lookup(ns, tokens, media)
            assert (None if match is None else (match.length, match.entry)) == expected
            if match is not None:
                reused = sum(1 for s in media if s.end <= match.length)
                assert sum(match.media_reused.values()) == reused
                assert sum(match.media_to_encode.values()) == len(media) - reused
                if data.draw(st.booleans(), label="acquire"):
                    leases.append(real.acquire(match, ns))
                    ref.acquire(match.entry)
        elif op == "release" and leases:
            lease = leases.pop(data.draw(st.integers(0, len(leases) - 1), label="which lease"))
            real.release(lease)
            ref.release(lease.entry)
        elif op == "evict":
            dropped = real.evict()
            idle = [e for e in ref.entries.values() if not e.users]
            for e in idle:
                del ref.entries[e.eid]
            ref.counters["evictions"] += len(idle)
            assert dropped == len(idle)
        real.check_invariants()
        assert real.entry_ids() == ref.lru()
        assert {e: real.entry_tier(e) for e in real.entry_ids()} == {e.eid: e.tier for e in ref.entries.values()}
        stats = real.stats()
        assert (stats.offloads, stats.evictions, stats.superseded) == (
            ref.counters["offloads"],
            ref.counters["evictions"],
            ref.counters["superseded"],
        )
    for lease in leases:
        real.release(lease)
    real.check_invariants()
