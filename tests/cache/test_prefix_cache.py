"""cache.prefix_cache, the map's own rules through PrefixCache's API: an insert supersedes what it serves (an entry in
use at its last release), adds nothing when already served; evict() frees least recently used first and skips
entries in use; a dropped match cannot be acquired; lookups are counted. (Budgets and tiers: test_memory, the
property test against the reference: test_properties.)"""

from __future__ import annotations

import pytest

from cache import DEVICE, LeaseError, Namespace, PrefixCache
from tests.cache.helpers import nbytes, normal, recurrent

NS = Namespace("model-a", "float32")
ENTRY = nbytes([normal(4)])  # bytes of one 4-token entry


def four(first: int) -> list[int]:
    return [first, first + 1, first + 2, first + 3]


def test_evict_frees_lru_first_and_skips_entries_in_use():
    cache = PrefixCache()
    a, b, c = (cache.insert(NS, four(10 * i), [normal(4)]) for i in (1, 2, 3))
    lease = cache.acquire(cache.lookup(NS, [*four(10), 0]), NS)  # a is in use and most recent
    assert cache.entry_ids() == [b, c, a]
    assert cache.evict(bytes_to_free=ENTRY) == 1 and cache.entry_ids() == [c, a]
    assert cache.evict() == 1 and cache.entry_ids() == [a]
    cache.release(lease)
    cache.check_invariants()


def test_a_conversation_keeps_about_one_copy_of_its_kv():
    cache = PrefixCache()
    tokens: list[int] = []
    for turn in range(20):
        tokens = tokens + [turn + 1] * 5  # the rendered prompt grows
        cache.insert(NS, tokens, [normal(len(tokens))])
        tokens = tokens + [100 + turn] * 7  # ... and the reply after it
        cache.insert(NS, tokens, [normal(len(tokens))])
    assert cache.stats().entries == 1
    assert cache.stats().bytes_per_tier[DEVICE] == nbytes([normal(len(tokens))])
    cache.check_invariants()


def test_a_superseded_entry_in_use_is_dropped_at_its_last_release():
    cache = PrefixCache()
    old = cache.insert(NS, [1, 2, 3], [normal(3)])
    lease = cache.acquire(cache.lookup(NS, [1, 2, 3, 4]), NS)
    new = cache.insert(NS, [1, 2, 3, 4, 5], [normal(5)])
    assert set(cache.entry_ids()) == {old, new}
    cache.check_invariants()
    cache.release(lease)
    assert cache.entry_ids() == [new]
    cache.check_invariants()


def test_recurrent_entries_are_superseded_only_when_every_snapshot_is_kept():
    cache = PrefixCache()
    old = cache.insert(NS, [1, 2, 3, 4], [recurrent({2, 4})])
    keeps_one = cache.insert(NS, [1, 2, 3, 4, 5, 6], [recurrent({4, 6})])
    assert set(cache.entry_ids()) == {old, keeps_one}  # the snapshot at 2 is only in old
    keeps_all = cache.insert(NS, [1, 2, 3, 4, 5, 6, 7], [recurrent({2, 4, 6, 7})])
    assert cache.entry_ids() == [keeps_all]
    cache.check_invariants()


def test_inserting_what_is_already_served_adds_nothing():
    cache = PrefixCache()
    long = cache.insert(NS, [1, 2, 3, 4, 5, 6], [normal(6)])
    assert cache.insert(NS, [1, 2, 3], [normal(3)]) == long
    assert cache.insert(NS, [1, 2, 3, 4, 5, 6], [normal(6)]) == long
    stats = cache.stats()
    assert stats.entries == 1 and stats.redundant_inserts == 2
    cache.check_invariants()


def test_a_match_whose_entry_was_dropped_cannot_be_acquired():
    cache = PrefixCache()
    cache.insert(NS, [1, 2, 3], [normal(3)])
    match = cache.lookup(NS, [1, 2, 3, 4])
    cache.evict()
    with pytest.raises(LeaseError):
        cache.acquire(match, NS)


def test_stats_count_lookups_hits_and_tokens():
    cache = PrefixCache()
    cache.insert(NS, [1, 2, 3, 4], [normal(4)])
    cache.lookup(NS, [1, 2, 3, 4, 5])
    cache.lookup(NS, [9, 9])
    stats = cache.stats()
    assert (stats.lookups, stats.hits, stats.query_tokens, stats.hit_tokens) == (2, 1, 7, 4)
    assert stats.hit_rate == 0.5
