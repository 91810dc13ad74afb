"""Byte budgets, the exact offload and eviction order, in-use protection, and supersession only while the successor
is held (the map's own supersession rules: test_prefix_cache)."""

from __future__ import annotations

import torch

from cache import DEVICE, HOST, Namespace, NormalKV, PrefixCache
from tests.cache.helpers import nbytes, normal

NS = Namespace("model-a", "float32")
ENTRY = nbytes([normal(4)])  # bytes of one 4-token entry


def four(first: int) -> list[int]:
    return [first, first + 1, first + 2, first + 3]


def tiers(cache: PrefixCache) -> dict[int, str]:
    return {eid: cache.entry_tier(eid) for eid in cache.entry_ids()}


def test_over_device_budget_the_lru_entry_is_offloaded_not_dropped():
    cache = PrefixCache(device_budget_bytes=2 * ENTRY, host_budget_bytes=10 * ENTRY)
    a, b, c = (cache.insert(NS, four(10 * i), [normal(4)]) for i in (1, 2, 3))
    assert tiers(cache) == {a: HOST, b: DEVICE, c: DEVICE}
    cache.lookup(NS, [*four(20), 0])  # touch b
    d = cache.insert(NS, four(40), [normal(4)])
    assert tiers(cache) == {a: HOST, c: HOST, b: DEVICE, d: DEVICE}  # c was least recently used on device
    assert cache.stats().offloads == 2 and cache.stats().evictions == 0
    cache.check_invariants()


def test_over_host_budget_the_lru_host_entry_is_dropped():
    cache = PrefixCache(device_budget_bytes=ENTRY, host_budget_bytes=2 * ENTRY)
    ids = [cache.insert(NS, four(10 * i), [normal(4)]) for i in range(1, 5)]
    assert cache.entry_ids() == ids[1:]  # ids[0] went device -> host -> dropped
    assert tiers(cache) == {ids[1]: HOST, ids[2]: HOST, ids[3]: DEVICE}
    assert cache.stats().evictions == 1 and cache.stats().offloads == 3
    assert cache.lookup(NS, [*four(10), 0]) is None
    cache.check_invariants()


def test_without_a_host_tier_the_device_lru_is_dropped():
    cache = PrefixCache(device_budget_bytes=2 * ENTRY, host_budget_bytes=0)
    a, b, c = (cache.insert(NS, four(10 * i), [normal(4)]) for i in (1, 2, 3))
    assert cache.entry_ids() == [b, c] and cache.stats().offloads == 0 and cache.stats().evictions == 1
    assert a not in cache.entry_ids()


def test_acquire_promotes_a_host_entry_and_offloads_another():
    cache = PrefixCache(device_budget_bytes=ENTRY, host_budget_bytes=10 * ENTRY)
    a, b = (cache.insert(NS, four(10 * i), [normal(4)]) for i in (1, 2))
    assert tiers(cache) == {a: HOST, b: DEVICE}
    lease = cache.acquire(cache.lookup(NS, [*four(10), 0]), NS)
    assert tiers(cache) == {a: DEVICE, b: HOST}
    assert torch.equal(lease.layers[0].keys, normal(4).keys)
    cache.release(lease)
    assert cache.stats().promotions == 1
    cache.check_invariants()


def test_an_entry_in_use_is_never_evicted():
    cache = PrefixCache(device_budget_bytes=ENTRY, host_budget_bytes=0)
    a = cache.insert(NS, four(10), [normal(4)])
    lease = cache.acquire(cache.lookup(NS, [*four(10), 0]), NS)
    b = cache.insert(NS, four(20), [normal(4)])  # over budget, but a is in use: b (idle) goes instead
    assert cache.entry_ids() == [a]
    assert b not in cache.entry_ids()
    cache.release(lease)
    cache.check_invariants()
    assert cache.evict() == 1 and cache.entry_ids() == []


def test_bytes_of_shared_storage_are_counted_once_per_tier():
    cache = PrefixCache()
    buffer = torch.zeros(1, 1, 16, 2)  # one preallocated buffer, two entries viewing it
    cache.insert(NS, [1, 2, 3, 4], [NormalKV(buffer[..., :4, :], buffer[..., :4, :])])
    cache.insert(NS, [1, 2, 3, 9, 9], [NormalKV(buffer[..., :5, :], buffer[..., :5, :])])
    assert cache.stats().entries == 2
    assert cache.stats().bytes_per_tier[DEVICE] == buffer.untyped_storage().nbytes()
    cache.check_invariants()


# -- eviction that keeps what fits (issue 14): supersession only while the successor is held, too-big entries first


def test_an_extension_too_big_for_every_tier_leaves_the_entry_it_extends():
    cache = PrefixCache(device_budget_bytes=nbytes([normal(5)]), host_budget_bytes=0)
    old = cache.insert(NS, [1, 2, 3, 4, 5], [normal(5)])
    new = cache.insert(NS, [1, 2, 3, 4, 5, 6, 7, 8], [normal(8)])
    assert cache.entry_ids() == [old] and new != old
    assert (cache.stats().superseded, cache.stats().evictions) == (0, 1)
    assert cache.lookup(NS, [1, 2, 3, 4, 5, 9]).length == 5
    cache.check_invariants()


def test_a_superseded_entry_in_use_stays_when_its_successor_was_evicted():
    cache = PrefixCache(device_budget_bytes=nbytes([normal(4), normal(6)]), host_budget_bytes=0)
    old = cache.insert(NS, [1, 2, 3, 4], [normal(4)])
    lease = cache.acquire(cache.lookup(NS, [1, 2, 3, 4, 9]), NS)  # the turn: acquire ...
    new = cache.insert(NS, [1, 2, 3, 4, 5, 6], [normal(6)])  # ... insert prompt + reply ...
    other = cache.insert(NS, [7, 8, 9, 10], [normal(4)])  # (another session's turn pushes the new entry out)
    assert new not in cache.entry_ids()
    cache.release(lease)  # ... release: the old entry is all that serves [1, 2, 3, 4] now
    assert cache.entry_ids() == [old, other]
    assert cache.lookup(NS, [1, 2, 3, 4, 9]).length == 4
    assert cache.stats().superseded == 0
    cache.check_invariants()


def test_a_superseded_entry_in_use_goes_at_release_while_its_successor_is_held():
    cache = PrefixCache(device_budget_bytes=nbytes([normal(4), normal(6)]), host_budget_bytes=0)
    cache.insert(NS, [1, 2, 3, 4], [normal(4)])
    lease = cache.acquire(cache.lookup(NS, [1, 2, 3, 4, 9]), NS)
    new = cache.insert(NS, [1, 2, 3, 4, 5, 6], [normal(6)])
    cache.release(lease)
    assert cache.entry_ids() == [new] and cache.stats().superseded == 1
    cache.check_invariants()


def test_an_entry_too_big_for_every_tier_does_not_push_out_one_that_fits():
    cache = PrefixCache(device_budget_bytes=nbytes([normal(6)]), host_budget_bytes=nbytes([normal(6)]))
    small = cache.insert(NS, four(10), [normal(4)])
    big = cache.insert(NS, [20 + i for i in range(8)], [normal(8)])  # fits neither tier alone
    assert cache.entry_ids() == [small] and big not in cache.entry_ids()
    assert tiers(cache) == {small: DEVICE}
    assert cache.stats().evictions == 1 and cache.stats().offloads == 0
    cache.check_invariants()
