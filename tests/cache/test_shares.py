"""Tenant shares: the exact eviction order when tenants (namespace salts) compete for a tier, in small cases.

Every entry here is 4 tokens of one normal layer (``E`` bytes in memory, ``F`` bytes of file) unless it says
otherwise, and tokens differ between entries, so nothing is superseded unless a test wants it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cache import DEVICE, DISK, HOST, LengthError, Namespace, PrefixCache
from cache.disk_format import payload_bytes
from tests.cache.helpers import nbytes, normal

A = Namespace("model-a", "float32", salt="tenant-a")
B = Namespace("model-a", "float32", salt="tenant-b")
C = Namespace("model-a", "float32", salt="tenant-c")
E = nbytes([normal(4)])  # memory bytes of one entry
F = payload_bytes([normal(4)])  # file bytes of one entry
_next_token = iter(range(1, 10**6, 4))


def put(cache: PrefixCache, ns: Namespace, length: int = 4) -> int:
    """Insert an entry of fresh tokens (``length`` of them, one normal layer) into ``ns``; return its id."""
    first = next(_next_token) * 100
    return cache.insert(ns, list(range(first, first + length)), [normal(length)])


def tiers(cache: PrefixCache) -> dict[int, str]:
    return {eid: cache.entry_tier(eid) for eid in cache.entry_ids()}


def test_the_example_of_the_design_doc_step_by_step():
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=0.5)
    b1 = put(cache, B)  # t1
    a1, a2, a3 = put(cache, A), put(cache, A), put(cache, A)  # t2-t4: A over its share, the tier within budget
    assert cache.entry_ids() == [b1, a1, a2, a3]
    a4 = put(cache, A)  # t5
    assert cache.entry_ids() == [b1, a2, a3, a4]
    b2 = put(cache, B)  # t6
    assert cache.entry_ids() == [b1, a3, a4, b2]
    a5 = put(cache, A, length=12)  # t7: 3 units
    assert cache.entry_ids() == [b1, a3, a4, b2] and a5 not in cache.entry_ids()
    cache.check_invariants()


@pytest.mark.parametrize("share", [None, 0.5])
def test_the_tenant_over_its_share_loses_its_lru_entry_before_another_tenants_older_one(share):
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=share)
    b1 = put(cache, B)
    a1, a2, a3 = put(cache, A), put(cache, A), put(cache, A)
    a4 = put(cache, A)  # 5 E > 4 E: A holds 4 E, over its share of 2 E; B holds 1 E
    if share is None:
        assert cache.entry_ids() == [a1, a2, a3, a4]  # plain LRU: B's older entry goes
    else:
        assert cache.entry_ids() == [b1, a2, a3, a4]
        a5 = put(cache, A)
        b2 = put(cache, B)  # B at 2 E is not over its share: A's least recently used goes again
        assert cache.entry_ids() == [b1, a4, a5, b2]
    assert cache.stats().evictions == (1 if share is None else 3)
    cache.check_invariants()


def test_among_tenants_over_their_share_the_least_recently_used_entry_goes_not_the_most_over_tenants():
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, tenant_share=0.25)  # 2 E each
    a1 = put(cache, A)
    a2 = cache.insert(A, [1, 2, 3, 4], [normal(4)])
    a3 = put(cache, A)  # A: 3 E, 1 E over its share
    bs = [put(cache, B) for _ in range(5)]  # B: 5 E, 3 E over
    c1 = put(cache, C)  # 9 E: a1 is the least recently used entry of a tenant over its share
    assert a1 not in cache.entry_ids() and cache.entry_ids() == [a2, a3, *bs, c1]
    assert cache.lookup(A, [1, 2, 3, 4, 0]).entry == a2  # a2 is now the most recently used
    c2 = put(cache, C)  # A is at its share (2 E): B's least recently used goes, not a3
    assert cache.entry_ids() == [a3, *bs[1:], c1, a2, c2]
    cache.check_invariants()


def test_three_tenants_each_lose_their_own_lru_entry_once_over_their_share():
    cache = PrefixCache(device_budget_bytes=6 * E, host_budget_bytes=0, tenant_share=1 / 3)  # 2 E each
    a1, a2, a3 = (put(cache, A) for _ in range(3))
    b1, b2, b3 = (put(cache, B) for _ in range(3))
    c1 = put(cache, C)  # A and B are both over: a1 is the least recently used of theirs
    c2 = put(cache, C)  # A is at its share now: B's b1
    c3 = put(cache, C)  # only C is over (3 E): its own c1 goes, though a2 is older
    assert cache.entry_ids() == [a2, a3, b2, b3, c2, c3]
    assert a1 not in cache.entry_ids() and b1 not in cache.entry_ids() and c1 not in cache.entry_ids()
    cache.check_invariants()


def test_alone_in_a_tier_a_tenant_may_fill_it():
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=0.25)
    a = [put(cache, A) for _ in range(4)]  # 4 E, four times its share: nobody else needs room
    assert cache.entry_ids() == a and cache.stats().evictions == 0
    b1 = put(cache, B)  # now B needs room: A's least recently used goes
    assert cache.entry_ids() == [*a[1:], b1]
    cache.check_invariants()


def test_in_a_tier_where_only_one_tenant_holds_bytes_the_order_is_plain_lru():
    cache = PrefixCache(device_budget_bytes=2 * E, host_budget_bytes=3 * E, tenant_share=0.5)  # E, 1.5 E each
    cache.insert(B, [1, 2, 3, 4], [normal(4)])
    lease = cache.acquire(cache.lookup(B, [1, 2, 3, 4, 0]), B)  # B holds the device tier, never the host tier
    a1, a2 = put(cache, A), put(cache, A)  # a1 -> host
    big = put(cache, A, length=8)  # 2 E: cannot fit the device beside B's lease -> host
    assert tiers(cache) == {a1: HOST, big: HOST, a2: DEVICE, lease.entry: DEVICE}
    a4 = put(cache, A)  # a2 -> host: 4 E there, all A's: its least recently used goes, not the entry beyond a share
    assert tiers(cache) == {big: HOST, a2: HOST, a4: DEVICE, lease.entry: DEVICE}
    cache.release(lease)
    cache.check_invariants()


def test_entries_in_use_stay_and_then_plain_lru_applies():
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=0.5)
    leases = []
    for _ in range(3):  # A: 3 E, over its share of 2 E, but every entry of A is in use
        first = next(_next_token) * 100
        tokens = list(range(first, first + 4))
        cache.insert(A, tokens, [normal(4)])
        leases.append(cache.acquire(cache.lookup(A, [*tokens, 0]), A))
    b1 = put(cache, B)
    b2 = put(cache, B)  # 5 E; B (2 E) is under its share, A has nothing idle: the least recently used idle goes
    assert b1 not in cache.entry_ids() and b2 in cache.entry_ids()
    assert all(lease.entry in cache.entry_ids() for lease in leases)
    for lease in leases:
        cache.release(lease)
    cache.check_invariants()


def test_an_entry_that_cannot_fit_its_tenants_share_goes_before_that_tenants_older_ones():
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=0.5)  # 2 E each
    b1 = put(cache, B)
    a1, a2 = put(cache, A), put(cache, A)
    big = put(cache, A, length=12)  # 3 E: more than A's share on its own
    assert cache.entry_ids() == [b1, a1, a2] and big not in cache.entry_ids()
    cache.check_invariants()


def test_an_extension_beyond_its_tenants_share_leaves_the_entry_it_extends():
    """The share's version of issue 14: the extension would supersede the entry it extends, then be pushed out by
    the share rule, leaving nothing of the conversation although the older entry fits the share."""
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=0.5)  # 2 E each
    b1 = cache.insert(B, list(range(500, 508)), [normal(8)])  # 2 E
    old = cache.insert(A, list(range(1, 9)), [normal(8)])  # 2 E
    new = cache.insert(A, list(range(1, 13)), [normal(12)])  # 3 E, extends old
    assert cache.entry_ids() == [b1, old] and new not in cache.entry_ids()
    assert (cache.stats().superseded, cache.stats().evictions) == (0, 1)
    assert cache.lookup(A, [*range(1, 9), 99]).length == 8
    cache.check_invariants()


def test_an_extension_within_its_tenants_share_supersedes_as_before():
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, tenant_share=0.5)
    cache.insert(B, list(range(500, 508)), [normal(8)])
    cache.insert(A, list(range(1, 9)), [normal(8)])
    new = cache.insert(A, list(range(1, 13)), [normal(12)])
    assert cache.entry_ids()[-1] == new and cache.stats().superseded == 1 and cache.stats().entries == 2
    cache.check_invariants()


def test_the_host_tier_takes_from_the_tenant_over_its_host_share():
    cache = PrefixCache(device_budget_bytes=E, host_budget_bytes=4 * E, tenant_share=0.5)
    b1, b2 = put(cache, B), put(cache, B)
    a1, a2, a3, a4 = (put(cache, A) for _ in range(4))  # each insert pushes the one before it to the host
    assert tiers(cache) == {b1: HOST, b2: HOST, a2: HOST, a3: HOST, a4: DEVICE}  # a1 left the host, not b1
    assert cache.stats().bytes_per_tenant == {
        A.salt: {DEVICE: E, HOST: 2 * E, DISK: 0},
        B.salt: {DEVICE: 0, HOST: 2 * E, DISK: 0},
    }
    assert a1 not in cache.entry_ids()
    cache.check_invariants()


def test_the_disk_tier_takes_from_the_tenant_over_its_disk_share(tmp_path: Path):
    cache = PrefixCache(
        device_budget_bytes=0, host_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=4 * F, tenant_share=0.5
    )
    try:
        b1 = put(cache, B)
        a1, a2, a3, a4 = (put(cache, A) for _ in range(4))
        assert cache.entry_ids() == [b1, a2, a3, a4] and a1 not in cache.entry_ids()  # a1 lost its file, not b1
        assert set(tiers(cache).values()) == {DISK}
        per_tenant = cache.stats().bytes_per_tenant
        assert (per_tenant[A.salt][DISK], per_tenant[B.salt][DISK]) == (3 * F, F)
        cache.check_invariants()
    finally:
        cache.close(timeout=10)


def test_with_one_tenant_a_share_changes_nothing():
    def run(share):
        cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=2 * E, tenant_share=share)
        start = 7000
        ids = []
        for length in (8, 12, 4, 4, 8):  # 2 E, 3 E (more than a 0.5 share alone), ...
            ids.append(cache.insert(A, list(range(start, start + length)), [normal(length)]))
            start += 100
        cache.check_invariants()
        stats = cache.stats()
        return [ids.index(e) for e in cache.entry_ids()], list(tiers(cache).values()), stats.offloads, stats.evictions

    assert run(0.5) == run(None)


def test_stats_report_bytes_per_tenant_and_tier():
    cache = PrefixCache(device_budget_bytes=2 * E, host_budget_bytes=4 * E, tenant_share=0.5)
    put(cache, A), put(cache, A), put(cache, B)
    stats = cache.stats()
    assert stats.tenant_share == 0.5
    assert stats.bytes_per_tenant == {
        A.salt: {DEVICE: E, HOST: E, DISK: 0},
        B.salt: {DEVICE: E, HOST: 0, DISK: 0},
    }
    cache.evict(namespace=A)
    assert set(cache.stats().bytes_per_tenant) == {B.salt}
    assert PrefixCache().stats().tenant_share is None


@pytest.mark.parametrize("share", [0, -0.5, 1.5, math.nan, True, "0.5"])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(LengthError):
        PrefixCache(tenant_share=share)


@pytest.mark.parametrize("share", [1, 1.0, 0.01])
def test_shares_in_zero_to_one_are_taken(share):
    assert PrefixCache(tenant_share=share).stats().tenant_share == float(share)
