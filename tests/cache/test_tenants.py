"""cache.tenants against a plain recount: after any sequence of entries, storages and files added and removed, the
bytes each tenant holds per tier are its distinct storages (a storage shared by two entries of a tenant counts once
for it) or its files, a tenant is over its share only beyond the limit while another tenant holds bytes there, and
two ledgers of the same holdings compare equal."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from cache import Namespace, PrefixCache, Stateless
from cache.tenants import StorageCounts, TenantBytes, share_limit
from cache.tiers import DEVICE, DISK, HOST, TIERS

SALTS = ("a", "b", "c")
STORAGES = {("cpu", None, i): 8 * (i + 1) for i in range(5)}  # five storages of 8..40 bytes


@st.composite
def holdings(draw) -> list[tuple[str, str, tuple[tuple, ...], int]]:
    """Entries: (salt, tier, storage keys, file bytes); an entry may hold no storage (stateless layers only)."""
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(SALTS),
                st.sampled_from((DEVICE, HOST)),
                st.sets(st.sampled_from(sorted(STORAGES)), min_size=0, max_size=3).map(lambda s: tuple(sorted(s))),
                st.integers(0, 3).map(lambda n: 16 * n),
            ),
            max_size=8,
        )
    )


def add(ledger: TenantBytes, entry) -> None:
    salt, tier, keys, file = entry
    ledger.add_entry(salt)
    ledger.add_storages(tier, salt, [(k, STORAGES[k]) for k in keys])
    ledger.add_file(salt, file)


def remove(ledger: TenantBytes, entry) -> None:
    salt, tier, keys, file = entry
    ledger.remove_entry(salt)
    ledger.remove_storages(tier, salt, [(k, STORAGES[k]) for k in keys])
    ledger.remove_file(salt, file)


def recount(live, tier: str, salt: str) -> int:
    if tier == DISK:
        return sum(file for s, _, _, file in live if s == salt)
    return sum(STORAGES[k] for k in {k for s, t, keys, _ in live if (s, t) == (salt, tier) for k in keys})


@settings(max_examples=100, deadline=None)
@given(holdings(), st.data())
def test_the_ledger_agrees_with_a_recount_of_what_is_held(entries, data):
    ledger = TenantBytes()
    for entry in entries:
        add(ledger, entry)
    gone = data.draw(st.sets(st.integers(0, max(len(entries) - 1, 0))) if entries else st.just(set()), label="gone")
    for i in sorted(gone):
        remove(ledger, entries[i])
    live = [e for i, e in enumerate(entries) if i not in gone]
    limit = data.draw(st.none() | st.integers(0, 100), label="limit")
    for tier in TIERS:
        for salt in SALTS:
            held = recount(live, tier, salt)
            assert ledger.bytes_in(tier, salt) == held
            others = any(recount(live, tier, other) for other in SALTS if other != salt)
            assert ledger.over_share(tier, salt, limit) == (limit is not None and held > limit and others)
    assert ledger.tenants() == len({s for s, *_ in live})
    assert ledger.per_tenant() == {s: {t: recount(live, t, s) for t in TIERS} for s in sorted({s for s, *_ in live})}
    fresh = TenantBytes()
    for entry in live:
        add(fresh, entry)
    assert fresh == ledger  # tenants holding nothing of a kind are left out of each table


def test_a_storage_counts_once_until_its_last_holder_goes():
    counts = StorageCounts()
    one = [(("cpu", None, 1), 64)]
    assert counts.add(one) == 64 and counts.add(one) == 0 and counts.nbytes == 64
    assert counts.remove(one) == 0 and counts.nbytes == 64
    assert counts.remove(one) == 64 and counts.nbytes == 0 and counts.refs == {}


def test_the_share_limit_is_the_floor_of_the_share_of_the_budget():
    assert share_limit(0.5, 101) == 50 and share_limit(1.0, 7) == 7 and share_limit(1 / 3, 3) == math.floor(1 / 3 * 3)
    assert share_limit(None, 100) is None and share_limit(0.5, None) is None
    assert Counter() == TenantBytes().entries


def test_entries_holding_no_tensor_can_be_removed():
    cache = PrefixCache()
    ns = Namespace("m", "float32")
    cache.insert(ns, [1, 2, 3], [Stateless()])
    cache.insert(ns, [5, 6, 7], [Stateless()])
    cache.check_invariants()
    assert cache.evict() == 2  # the tenant's empty counts once dropped at the first: a KeyError at the second
    cache.check_invariants()
