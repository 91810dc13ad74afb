"""Property test: the radix-indexed cache agrees with the linear-scan reference on random workloads, and never loses
what its budgets allowed it to keep.

Random sequences share prefixes (each new one extends or edits an earlier one, or extends a prefix in use, as a turn
does), carry media spans, and go into namespaces whose layouts mix normal, rotating, recurrent and stateless layers.
Budgets are random (device, host and disk: files in a temporary directory, written by the real background writer),
small enough that offload, spills to disk, eviction and read-back happen. Operations are random too: insert, lookup
(then maybe acquire; often the next turn of an earlier sequence, or of an entry held only on disk), extend a leased
prefix, release, evict, flush (wait for the writer, so that later read-backs
come from the files).

After every step:

- ``check_invariants()`` holds;
- **no loss without an eviction**: an entry dropped in the step whose servable lengths are not all served by the
  entries held afterwards counts as a loss; losses never outnumber the step's evictions (a supersession is never a
  loss: what superseded the entry must still be held);
- **never empty where something fit**: if no idle entry is left after a step other than ``evict()``, no entry that was
  idle before the step (or inserted in it) and would fit in some tier beside the entries in use was lost;
- both caches agree on every answer, on which entries they hold, on each one's tier and file, and on the counters;
- **shares respected** (tenant shares on): no tenant within its share of a tier loses an entry (or, on the disk
  tier, a file) there for the budget while another tenant is over its share of that tier with an idle entry in it,
  unless the entry could not fit the tier at all (read from the reference's log of moves, which the real cache
  matches step by step).

- **pins hold**: every prefix pinned and not yet due (its expiry as the pin call promised it, a lower bound: uses
  only push it back) is still restorable from an entry held in memory, and the two caches agree on every pin (its
  prefix, holder and expiry) and on every pin call's answer. Pins come and go with random lengths, TTLs (5 s, 5 min,
  1 h) and time steps (the clock is stepped by hand; nothing sleeps).

Three share modes: "off" (two tenants, no shares: the rules as before), "one tenant" (the real cache has a share,
the reference none: with one tenant a share changes nothing) and "on" (three tenants, both with the same share).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import MediaKind, MediaSpan, Namespace, PrefixCache
from cache.disk_format import payload_bytes
from tests.cache.helpers import nbytes, normal, recurrent, rotating, stateless
from tests.cache.reference import Move, RefEntry, ReferenceCache, spans_before


class Clock:
    """Seconds, stepped by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


LAYOUTS = ("normal", "rotating", "recurrent", "rotating+recurrent", "stateless")
WINDOW = 3
UNIT = nbytes([normal(6)]) // 4  # 24 bytes: a budget step


def build(layout: str, length: int, data, carry: frozenset[int] = frozenset()) -> tuple[list, int, set[int] | None]:
    """Layers for a sequence of ``length`` tokens, and what the reference needs: rotating lo, recurrent points.
    ``carry``: snapshot lengths inherited from the entry this one extends (as the engine carries them on)."""
    lo, points = 0, None
    layers = []
    if layout in ("rotating", "rotating+recurrent"):
        rows = data.draw(st.integers(min(length, WINDOW - 1), length), label="rows")
        layer = rotating(length, WINDOW, rows)
        layers.append(layer)
        lo = layer.shortest()
    if layout in ("recurrent", "rotating+recurrent"):
        points = set(data.draw(st.sets(st.integers(1, length)), label="snapshots")) | {length} | set(carry)
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
        cut = draw(st.just(len(base_tokens)) | st.integers(0, len(base_tokens)))  # often a whole earlier one
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


@dataclass
class Budgets:
    device: int | None
    host: int | None
    disk: int

    def fits_somewhere(self, e: RefEntry, in_use: list[RefEntry], files: dict[int, bool]) -> bool:
        """Whether ``e`` would fit in some tier beside the entries in use and nothing else."""
        if self.device is None or e.nbytes + sum(o.nbytes for o in in_use) <= self.device:
            return True
        if self.host != 0 and (self.host is None or e.nbytes <= self.host):
            return True
        return self.disk > 0 and e.dbytes + sum(o.dbytes for o in in_use if files.get(o.eid)) <= self.disk


def served(held: list[RefEntry], e: RefEntry, n: int) -> bool:
    """Whether some held entry serves ``e``'s prefix of length ``n``."""
    return any(
        f.namespace == e.namespace
        and n in f.servable()
        and f.tokens[:n] == e.tokens[:n]
        and spans_before(f.media, n) == spans_before(e.media, n)
        for f in held
    )


def lossy(e: RefEntry, held: list[RefEntry]) -> bool:
    return any(not served(held, e, n) for n in e.servable())


def check_nothing_lost(real, known, before, budgets, leases, evictions_before, op, inserted):
    """The two loss properties of the module docstring, from the entries' own descriptions (no reference)."""
    after_ids = real.entry_ids()
    held = [known[i] for i in after_ids]
    dropped = [known[i] for i in before if i not in set(after_ids)]
    losses = [e.eid for e in dropped if lossy(e, held)]
    evicted = real.stats().evictions - evictions_before
    assert len(losses) <= evicted, f"{op}: entries {losses} lost, {evicted} evicted"
    if op == "evict":
        return
    in_use_ids = {lease.entry for lease in leases}
    if any(i not in in_use_ids for i in after_ids):
        return
    in_use = [known[i] for i in in_use_ids]
    files = {i: real.entry_has_file(i) for i in after_ids}
    candidates = [known[i] for i in before if before[i] == 0] + [known[i] for i in inserted]
    for e in candidates:
        if e.eid not in after_ids and budgets.fits_somewhere(e, in_use, files):
            assert not lossy(e, held), f"{op}: nothing idle is left, but entry {e.eid} fit and was lost"


def budget(most: int, *kinds: str):
    """A byte budget: "few" (2 to ``most`` steps: a few entries' worth), "zero" or "none" (unlimited)."""
    values = {"zero": lambda k: 0, "none": lambda k: None, "few": lambda k: k * UNIT}
    return st.tuples(st.sampled_from(kinds), st.integers(2, most)).map(lambda pair: values[pair[0]](pair[1]))


KINDS = {  # (device, host, disk) budget kinds in each run of the test
    "memory": (("few", "few", "few", "zero", "none"), ("zero", "zero", "few", "none"), ("zero",)),
    "disk": (("few", "few", "zero"), ("zero", "few"), ("few",)),  # entries leave memory often, for the disk
    "host": (("few",), ("few",), ("zero", "few")),  # entries pass through the host tier often
}


def check_shares_respected(moves: list[Move], share: float | None, budgets: Budgets) -> None:
    """The shares property of the module docstring, over the moves the reference logged in one step."""
    for move in moves:
        budget = {"device": budgets.device, "host": budgets.host, "disk": budgets.disk}[move.tier]
        if share is None or budget is None or not move.fits:
            continue
        limit = math.floor(share * budget)
        held = move.tenant_bytes
        over = {salt for salt, n in held.items() if n > limit and any(v for o, v in held.items() if o != salt)}
        if move.salt in over:
            continue
        starving = sorted(salt for salt in over if move.idle.get(salt))
        assert not starving, f"{move}: a tenant within its share lost an entry while {starving} were over theirs"


SHARE_MODES = {  # mode -> (tenants, whether the real cache has a share, whether the reference has it)
    "off": (2, False, False),
    "one tenant": (1, True, False),
    "on": (3, True, True),
}


@pytest.mark.parametrize("shares", sorted(SHARE_MODES))
@pytest.mark.parametrize("tiers", sorted(KINDS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data())
def test_cache_agrees_with_linear_reference_and_keeps_what_fits(tiers, shares, data):
    """``derandomize``: the suite runs one fixed sequence of 150 examples per case, so that a landing does not
    depend on the draw. Random exploration finds more (set ``derandomize=False`` and run with
    ``--hypothesis-seed=random`` or a seed): seed 12785255949245291216207987224353160150 found that a lookup's
    read-back pushed out an idle entry host memory could hold (fixed; the example is in test_disk.py)."""
    tenants, real_share, ref_share = SHARE_MODES[shares]
    namespaces = [Namespace("m", "float32", salt=salt) for salt in ("", "t2", "t3")[:tenants]]
    share = data.draw(st.sampled_from([0.25, 1 / 3, 0.5, 1.0]) | st.floats(0.05, 1.0), label="share")
    layouts = {ns: data.draw(st.sampled_from(LAYOUTS), label="layout") for ns in namespaces}
    budgets = Budgets(
        device=data.draw(budget(24, *KINDS[tiers][0]), label="device budget"),
        host=data.draw(budget(24, *KINDS[tiers][1]), label="host budget"),
        disk=data.draw(budget(64, *KINDS[tiers][2]), label="disk budget"),
    )
    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp:
        real = PrefixCache(
            clock=clock,
            device_budget_bytes=budgets.device,
            host_budget_bytes=budgets.host,
            disk_dir=tmp,
            disk_budget_bytes=budgets.disk,
            disk_chunk_tokens=data.draw(st.integers(2, 5), label="chunk tokens"),
            tenant_share=share if real_share else None,
        )
        ref = ReferenceCache(budgets.device, budgets.host, budgets.disk, share if ref_share else None)
        ref.now, ref.pin_share = clock.t, share if real_share else None
        try:
            run_steps(data, real, ref, budgets, namespaces, layouts, clock)
        finally:
            real.close(timeout=10)


def check_pins_hold(real: PrefixCache, ref: ReferenceCache, known, promised: dict, now: float) -> None:
    """The pins property of the module docstring."""
    in_memory = [known[i] for i in real.entry_ids() if real.entry_tier(i) != "disk"]
    for (ns, tokens, media), expires in promised.items():
        if now < expires:
            e = RefEntry(-1, ns, list(tokens), media, 0, None, 0, 0, 0)
            assert served(in_memory, e, len(tokens)), f"pinned prefix of {len(tokens)} tokens lost before {expires}"
    mine = sorted((p.namespace.salt, p.length, p.expires_at, p.ttl_s, p.entry) for p in real.pins())
    theirs = sorted((p.key[0].salt, p.length, p.expires, p.ttl, p.holder) for p in ref.pins.values())
    assert mine == theirs


def run_steps(
    data, real: PrefixCache, ref: ReferenceCache, budgets: Budgets, namespaces, layouts, clock: Clock
) -> None:
    seen: dict[Namespace, list] = {ns: [] for ns in namespaces}  # sequences inserted, per namespace
    leases: list = []
    known: dict[int, RefEntry] = {}  # every entry ever added, as the reference first described it
    promised: dict[tuple, float] = {}  # (namespace, prefix tokens, prefix media) -> the expiry a pin call promised

    def insert(ns, tokens, media, carry=frozenset()) -> int:
        layers, lo, points = build(layouts[ns], len(tokens), data, carry)
        before = set(ref.entries)
        eid = real.insert(ns, tokens, layers, media=media)
        served_by, added = ref.insert(eid, ns, tokens, media, lo, points, nbytes(layers), payload_bytes(layers))
        assert served_by == eid and added == (eid not in before)
        if added:
            known[eid] = RefEntry(
                eid,
                ns,
                list(tokens),
                tuple(sorted(media)),
                lo,
                None if points is None else frozenset(points),
                nbytes(layers),
                payload_bytes(layers),
                0,
            )
        seen[ns].append((tokens, media))
        return eid if added else -1

    busy = [namespaces[0]] * 3 + namespaces[1:]  # one tenant busier than the others: it goes over its share
    for _ in range(data.draw(st.integers(5, 30), label="steps")):
        op = data.draw(
            st.sampled_from(
                ["insert", "lookup", "lookup", "reread", "extend", "extend", "release", "evict", "flush", "pin", "time"]
            )
        )
        ns = data.draw(st.sampled_from(busy), label="namespace")
        on_disk = [i for i in real.entry_ids() if real.entry_tier(i) == "disk"]
        query = None
        if op == "reread" and on_disk:  # the next turn of a conversation held only on disk
            e = known[data.draw(st.sampled_from(on_disk), label="disk entry")]
            if data.draw(st.booleans(), label="from its file"):  # else maybe from the writer's queue
                assert real.flush(timeout=10)
                ref.flush()
            op, ns, query = "lookup", e.namespace, ([*e.tokens, 1], list(e.media))
        before = {i: len([lease for lease in leases if lease.entry == i]) for i in real.entry_ids()}
        evictions_before = real.stats().evictions
        moves_before = len(ref.moves)
        inserted: list[int] = []
        if op == "insert":
            tokens, media = data.draw(sequences(seen[ns]), label="sequence")
            inserted.append(insert(ns, tokens, media))
        elif op == "extend" and real.entry_ids():  # a turn: a reply extends a prefix in use, or a whole entry
            if leases and data.draw(st.booleans(), label="extend a lease"):
                lease = data.draw(st.sampled_from(leases), label="lease")
                base, length, media = known[lease.entry], lease.length, list(lease.media)
            else:
                base = known[data.draw(st.sampled_from(real.entry_ids()), label="entry")]
                length, media = len(base.tokens), list(base.media)
            tail = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=6), label="tail")
            carry = frozenset(p for p in base.points or () if p <= length)
            inserted.append(insert(base.namespace, base.tokens[:length] + tail, media, carry))
        elif op == "lookup":
            if query is not None:
                tokens, media = query
            elif seen[ns] and data.draw(st.booleans(), label="the next turn of an earlier sequence"):
                tokens, media = data.draw(st.sampled_from(seen[ns]), label="earlier")
                tokens = [*tokens, 1]
            else:
                tokens, media = data.draw(sequences(seen[ns]), label="query")
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
            assert real.evict() == ref.evict_all_idle()
        elif op == "flush":  # every queued file written: later read-backs come from the files, not the queue
            assert real.flush(timeout=10)
            ref.flush()
        elif op == "pin" and (real.entry_ids() or seen[ns]):
            if real.entry_ids() and data.draw(st.booleans(), label="an entry's own prefix"):
                base = known[data.draw(st.sampled_from(real.entry_ids()), label="entry")]
                ns, tokens, media = base.namespace, base.tokens, list(base.media)
            elif seen[ns]:
                tokens, media = data.draw(st.sampled_from(seen[ns]), label="earlier")
            else:
                continue
            length = data.draw(st.integers(1, len(tokens)), label="pin length")
            ttl = data.draw(st.sampled_from([5.0, 300.0, 3600.0]), label="ttl")
            result = real.pin(ns, tokens, length, ttl, media=media)
            assert (result.pinned, result.reason, result.renewed) == ref.pin(ns, tokens, media, length, ttl)
            if result.pinned:
                assert result.expires_at >= clock.t + ttl
                key = (ns, tuple(tokens[:length]), spans_before(sorted(media), length))
                promised[key] = max(promised.get(key, 0.0), clock.t + ttl)
        elif op == "time":
            clock.t += data.draw(st.sampled_from([1.0, 5.0, 299.0, 300.0, 3600.0]), label="seconds")
            ref.now = clock.t
            assert real.expire_pins() == ref.expire()
        real.check_invariants()
        inserted = [i for i in inserted if i >= 0]
        check_nothing_lost(real, known, before, budgets, leases, evictions_before, op, inserted)
        check_shares_respected(ref.moves[moves_before:], ref.share, budgets)
        check_pins_hold(real, ref, known, promised, clock.t)
        assert real.entry_ids() == ref.lru()
        assert {e: real.entry_tier(e) for e in real.entry_ids()} == {e.eid: e.tier for e in ref.entries.values()}
        assert {e: real.entry_has_file(e) for e in real.entry_ids()} == {e.eid: e.file for e in ref.entries.values()}
        assert real.stats().bytes_per_tenant == {
            salt: {tier: ref.tenant_bytes(tier).get(salt, 0) for tier in ("device", "host", "disk")}
            for salt in sorted({e.namespace.salt for e in ref.entries.values()})
        }
        stats = real.stats()
        assert (stats.offloads, stats.evictions, stats.superseded, stats.spills) == (
            ref.counters["offloads"],
            ref.counters["evictions"],
            ref.counters["superseded"],
            ref.counters["spills"],
        )
    for lease in leases:
        real.release(lease)
    real.check_invariants()
