"""cache.map_pins, the map's side of pins: which entry a pin goes on (one restoring the prefix at exactly its length,
read back from disk or brought back from the host tier), renewals by pinning again or by a hit that restores the
prefix, and bad requests refused unchanged."""

from __future__ import annotations

import pytest

from cache import DEVICE, DISK, HOST, LengthError, NamespaceError, PrefixCache, TokenError
from tests.cache.helpers import image, normal
from tests.cache.pin_helpers import A, B, Clock, E, flood, fresh, put


def pinned_at_350() -> tuple[Clock, PrefixCache, list[int]]:
    """A cache holding 8 tokens of A whose first 6 were pinned at t=100 for 300 s; the clock at 350."""
    clock = Clock()
    cache = PrefixCache(device_budget_bytes=8 * E, host_budget_bytes=0, clock=clock)
    tokens = fresh(8)
    put(cache, A, tokens)
    assert cache.pin(A, tokens, 6, 300).expires_at == 400.0
    clock.t = 350.0
    return clock, cache, tokens


def test_a_hit_at_or_past_the_pinned_length_renews_the_pin_and_a_shorter_one_does_not():
    clock, cache, tokens = pinned_at_350()
    assert cache.lookup(A, [*tokens[:5], 9]).length == 5  # short of the pin: not a use of it
    assert [p.expires_at for p in cache.pins()] == [400.0]
    assert cache.lookup(A, [*tokens, 9]).length == 8  # restores the pinned prefix: a use
    assert [p.expires_at for p in cache.pins()] == [650.0]
    clock.t = 640.0
    assert cache.expire_pins() == 0
    clock.t = 650.0
    assert cache.expire_pins() == 1


def test_a_hit_of_exactly_the_pinned_length_renews_the_pin():
    _, cache, tokens = pinned_at_350()
    assert cache.lookup(A, [*tokens[:6], 9]).length == 6  # the pinned prefix itself, nothing past it
    assert [p.expires_at for p in cache.pins()] == [650.0]


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
