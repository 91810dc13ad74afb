"""cache.records: the one computed field of what the cache hands out (the rest are plain records)."""

from __future__ import annotations

from cache import CacheStats


def stats(lookups: int, hits: int) -> CacheStats:
    zeros = dict.fromkeys(("device", "host", "disk"), 0)
    return CacheStats(lookups and 1, 0, zeros, zeros, zeros, lookups, hits, 0, 0, 0, 0, 0, 0, 0, 0)


def test_the_hit_rate_is_hits_per_lookup_and_zero_before_any():
    assert stats(0, 0).hit_rate == 0.0
    assert stats(4, 1).hit_rate == 0.25 and stats(3, 3).hit_rate == 1.0
