"""Pins: a pinned prefix outlives other traffic until its TTL passes after its last use, within its tenant's share.

Every entry is one normal layer of ``E`` bytes per 4 tokens; the clock is stepped by hand (nothing sleeps).
"""

from __future__ import annotations

import pytest

from cache import DEVICE, DISK, HOST, LengthError, Namespace, NamespaceError, PrefixCache, TokenError
from tests.cache.helpers import image, nbytes, normal

A = Namespace("model-a", "float32", salt="tenant-a")
B = Namespace("model-a", "float32", salt="tenant-b")
E = nbytes([normal(4)])  # bytes of a 4-token entry
_fresh = iter(range(1_000, 10**7, 100))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def fresh(n: int = 4) -> list[int]:
    start = next(_fresh)
    return list(range(start, start + n))


def put(cache: PrefixCache, ns: Namespace, tokens: list[int]) -> int:
    return cache.insert(ns, tokens, [normal(len(tokens))])


def flood(cache: PrefixCache, ns: Namespace, entries: int) -> None:
    for _ in range(entries):
        put(cache, ns, fresh())


def restorable(cache: PrefixCache, ns: Namespace, tokens: list[int]) -> int:
    """The cached length a lookup of ``tokens`` + one more token finds (0: none)."""
    match = cache.lookup(ns, [*tokens, 7])
    return 0 if match is None else match.length


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


def test_a_hit_at_or_past_the_pinned_length_renews_the_pin_and_a_shorter_one_does_not():
    clock = Clock()
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, clock=clock)
    tokens = fresh(8)
    put(cache, A, tokens)
    assert cache.pin(A, tokens, 6, 300).expires_at == 400.0
    clock.t = 350.0
    assert cache.lookup(A, [*tokens[:5], 9]).length == 5  # short of the pin: not a use of it
    assert [p.expires_at for p in cache.pins()] == [400.0]
    assert cache.lookup(A, [*tokens, 9]).length == 8  # restores the pinned prefix: a use
    assert [p.expires_at for p in cache.pins()] == [650.0]
    clock.t = 640.0
    assert cache.expire_pins() == 0
    clock.t = 650.0
    assert cache.expire_pins() == 1


def test_pinning_again_renews_and_takes_the_longer_ttl():
    clock = Clock()
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, clock=clock)
    tokens = fresh()
    put(cache, A, tokens)
    cache.pin(A, tokens, 4, 300)
    clock.t += 100
    again = cache.pin(A, tokens, 4, 3600)
    assert again.pinned and again.renewed and again.expires_at == clock.t + 3600
    clock.t += 10
    assert cache.pin(A, tokens, 4, 300).expires_at == clock.t + 3600  # its ttl is 1 h now: a 5 min pin renews it so
    assert [(p.ttl_s, p.length) for p in cache.pins()] == [(3600.0, 4)]
    stats = cache.stats()
    assert (stats.pins_made, stats.pins_renewed, stats.pins) == (1, 2, 1)


def test_a_prefix_nothing_restores_at_exactly_that_length_is_refused_not_cached():
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, clock=Clock())
    tokens = fresh(8)
    put(cache, A, tokens[:6])
    assert cache.pin(A, tokens, 7, 300).reason == "not_cached"  # cached only to 6
    assert cache.pin(B, tokens, 4, 300).reason == "not_cached"  # another tenant's namespace
    media_tokens = fresh(8)
    cache.insert(A, media_tokens, [normal(8)], media=[image(2, 6)])
    refused = cache.pin(A, media_tokens, 4, 300, media=[image(2, 6)])  # inside the image
    assert not refused.pinned and refused.reason == "not_cached" and refused.expires_at is None
    assert cache.pin(A, media_tokens, 6, 300, media=[image(2, 6)]).pinned
    assert cache.stats().pins_refused == 3 and cache.stats().pins == 1


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


def test_a_pinned_entry_is_never_moved_to_the_host_tier_and_a_host_entry_pinned_comes_back_to_the_device():
    cache = PrefixCache(device_budget_bytes=2 * E, host_budget_bytes=16 * E, clock=Clock())
    pinned, offloaded = fresh(), fresh()
    put(cache, A, pinned)
    cache.pin(A, pinned, 4, 300)
    host_entry = put(cache, A, offloaded)
    flood(cache, B, 4)
    assert cache.entry_tier(host_entry) == HOST
    assert cache.entry_tier(cache.pins()[0].entry) == DEVICE
    assert cache.pin(A, offloaded, 4, 300).pinned
    assert cache.entry_tier(host_entry) == DEVICE and cache.stats().promotions == 1
    cache.check_invariants()


def test_a_prefix_only_on_disk_is_read_back_to_be_pinned(tmp_path):
    cache = PrefixCache(
        device_budget_bytes=E, host_budget_bytes=0, disk_dir=tmp_path, disk_budget_bytes=10**6, clock=Clock()
    )
    tokens = fresh()
    eid = put(cache, A, tokens)
    put(cache, B, fresh())
    assert cache.flush(timeout=10) and cache.entry_tier(eid) == DISK
    assert cache.pin(A, tokens, 4, 300).pinned
    assert cache.entry_tier(eid) == DEVICE and cache.stats().disk_reads == 1
    cache.close(timeout=10)


def test_bad_pin_requests_raise_and_change_nothing():
    cache = PrefixCache(clock=Clock())
    tokens = fresh()
    put(cache, A, tokens)
    for length in (0, 5, -1, 2.0, True):
        with pytest.raises(LengthError):
            cache.pin(A, tokens, length, 300)
    for ttl in (0, -1, float("inf"), float("nan"), "300", True):
        with pytest.raises(LengthError):
            cache.pin(A, tokens, 4, ttl)
    with pytest.raises(TokenError):
        cache.pin(A, [1, -2, 3], 2, 300)
    with pytest.raises(NamespaceError):
        cache.pin("tenant-a", tokens, 4, 300)
    assert cache.stats().pins == 0 and cache.stats().pins_refused == 0
