"""Pins: a pinned prefix outlives other traffic until its TTL passes after its last use, within its tenant's share,
and passes to an entry that supersedes its holder (cache.pins' table, cache.map_pins and the policy together; the
map's own steps: test_map_pins).

Every entry is one normal layer of ``E`` bytes per 4 tokens (tests/cache/pin_helpers.py); the clock is stepped by
hand (nothing sleeps).
"""

from __future__ import annotations

from cache import DEVICE, PrefixCache
from tests.cache.pin_helpers import A, B, Clock, E, flood, fresh, put, restorable


def test_a_pinned_prefix_survives_a_flood_of_other_tenants_traffic_and_goes_after_its_ttl():
    clock = Clock()
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, clock=clock)
    tokens = fresh()
    put(cache, A, tokens)
    result = cache.pin(A, tokens, 4, 300)
    assert result.pinned and result.reason is None and result.expires_at == 400.0 and not result.renewed
    flood(cache, B, 16)  # the device tier 4 times over
    assert restorable(cache, A, tokens) == 4
    assert cache.stats().pins == 1 and cache.stats().pinned_entries == 1 and cache.stats().pinned_bytes == E
    clock.t += 301  # the lookup above was a use at t=100: it lapses at 400
    assert cache.expire_pins() == 1 and cache.stats().pins_expired == 1 and cache.stats().pins == 0
    flood(cache, B, 4)
    assert restorable(cache, A, tokens) == 0
    cache.check_invariants()


def test_without_the_pin_the_same_flood_evicts_it():
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, clock=Clock())
    tokens = fresh()
    put(cache, A, tokens)
    flood(cache, B, 16)
    assert restorable(cache, A, tokens) == 0


def test_pins_beyond_the_tenants_share_of_the_device_tier_are_refused():
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, tenant_share=0.25, clock=Clock())  # 2 E
    first, second, third = fresh(), fresh(), fresh()
    for tokens in (first, second, third):
        put(cache, A, tokens)
    assert cache.pin(A, first, 4, 300).pinned and cache.pin(A, second, 2, 300).pinned
    refused = cache.pin(A, third, 4, 300)
    assert not refused.pinned and refused.reason == "over_share"
    assert cache.pin(A, first, 3, 300).pinned  # another pin on an entry already pinned costs nothing
    other = fresh()
    put(cache, B, other)
    assert cache.pin(B, other, 4, 300).pinned  # B's share is its own
    assert cache.stats().pinned_per_tenant == {
        "tenant-a": {"pins": 3, "entries": 2, "bytes": 2 * E, "refused": 1, "expired": 0},
        "tenant-b": {"pins": 1, "entries": 1, "bytes": E, "refused": 0, "expired": 0},
    }


def test_with_shares_off_pins_are_bounded_by_the_device_budget():
    cache = PrefixCache(device_budget_bytes=2 * E, host_budget_bytes=0, clock=Clock())
    seqs = [fresh() for _ in range(2)]
    for tokens in seqs:
        put(cache, A, tokens)
    assert [cache.pin(A, t, 4, 300).pinned for t in seqs] == [True, True]
    third = fresh()
    put(cache, B, third)  # dropped at once: nothing idle fits beside the two pinned entries
    assert cache.pin(B, third, 4, 300).reason == "not_cached"
    cache.check_invariants()


def test_pinned_entries_count_in_their_tenants_share_so_its_other_entries_go_first():
    cache = PrefixCache(device_budget_bytes=4 * E, host_budget_bytes=0, tenant_share=0.5, clock=Clock())  # 2 E
    pinned = fresh()
    put(cache, A, pinned)
    cache.pin(A, pinned, 4, 300)
    b1 = put(cache, B, fresh())
    a2, a3 = put(cache, A, fresh()), put(cache, A, fresh())  # A: 3 E with its pinned one, over its share
    b2 = put(cache, B, fresh())  # over budget: A's least recently used idle entry goes, not B's older one
    assert a2 not in cache.entry_ids() and {b1, a3, b2} <= set(cache.entry_ids())
    assert cache.stats().bytes_per_tenant["tenant-a"][DEVICE] == 2 * E
    cache.check_invariants()


def test_an_extension_takes_the_pin_over_and_the_entry_it_supersedes_goes():
    clock = Clock()
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, clock=clock)
    tokens = fresh(8)
    first = put(cache, A, tokens[:4])
    cache.pin(A, tokens, 4, 300)
    longer = put(cache, A, tokens)
    assert cache.entry_ids() == [longer] and cache.stats().superseded == 1
    assert [p.entry for p in cache.pins()] == [longer] and first not in cache.entry_ids()
    flood(cache, B, 12)
    assert restorable(cache, A, tokens[:4]) == 4
    cache.check_invariants()


def test_a_superseded_entry_in_use_and_pinned_goes_when_its_last_lease_is_released():
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, clock=Clock())
    tokens = fresh(8)
    first = put(cache, A, tokens[:4])
    lease = cache.acquire(cache.lookup(A, [*tokens[:4], 3]), A)
    cache.pin(A, tokens, 4, 300)
    longer = put(cache, A, tokens)  # the pin moves to `longer`; `first` stays while leased
    assert set(cache.entry_ids()) == {first, longer} and [p.entry for p in cache.pins()] == [longer]
    cache.release(lease)
    assert cache.entry_ids() == [longer]
    cache.check_invariants()
