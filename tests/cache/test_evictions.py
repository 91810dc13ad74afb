"""The record of evicted prefixes: its reach is the longest whole-block prefix a query shares with a remembered
evicted entry of its namespace (checked against a brute-force reference, with hypothesis), it forgets the oldest
entries beyond its capacity, and the cache feeds it on eviction only (not on supersession or release)."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from cache import Namespace, PrefixCache
from cache.evictions import EvictionRecord
from tests.cache.helpers import image, normal

BLOCK = 2


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _reference(remembered: list[tuple[str, list[int]]], namespace: str, query: list[int], capacity: int) -> int:
    """Brute force: the entries a record of ``capacity`` digests still holds (newest first, each its first
    ``capacity`` blocks), and the longest whole-block common prefix with one of the query's namespace."""
    held, kept = 0, []
    for ns, keys in reversed(remembered):
        blocks = min(len(keys) // BLOCK, capacity)
        if not blocks:
            continue
        if held + blocks > capacity:
            break
        held += blocks
        kept.append((ns, keys[: blocks * BLOCK]))
    return max((_common(keys, query) // BLOCK * BLOCK for ns, keys in kept if ns == namespace), default=0)


keys_st = st.lists(st.integers(0, 2), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    evicted=st.lists(st.tuples(st.sampled_from("ab"), keys_st), max_size=8),
    queries=st.lists(st.tuples(st.sampled_from("ab"), keys_st), min_size=1, max_size=4),
    capacity=st.integers(1, 12),
)
def test_reach_is_the_longest_whole_block_prefix_of_a_remembered_entry(evicted, queries, capacity):
    record = EvictionRecord(capacity=capacity, block=BLOCK)
    for ns, keys in evicted:
        record.record(ns, array("q", keys))
        record.check()
    for ns, query in queries:
        assert record.reach(ns, array("q", query)) == _reference(evicted, ns, query, capacity)


def test_another_namespace_never_answers_and_old_records_are_forgotten():
    record = EvictionRecord(capacity=4, block=BLOCK)
    record.record("a", array("q", [1, 2, 3, 4]))
    assert record.reach("a", array("q", [1, 2, 3, 4, 5])) == 4 and record.reach("b", array("q", [1, 2, 3, 4])) == 0
    record.record("a", array("q", [7, 7, 7, 7, 7, 7]))  # 3 digests: 5 held > 4, the first record goes
    assert record.reach("a", array("q", [1, 2, 3, 4])) == 0 and record.reach("a", array("q", [7] * 6)) == 6
    assert len(record) == 1


def test_the_cache_remembers_what_it_evicts_not_what_it_supersedes():
    cache = PrefixCache()
    ns = Namespace("m", "float32", "tenant")
    tokens = list(range(1, 41))
    cache.insert(ns, tokens[:20], [normal(20)])
    cache.insert(ns, tokens, [normal(40)])  # supersedes the first: nothing evicted
    assert cache.evicted_reach(ns, tokens) == 0
    assert cache.evict() == 1
    cache.check_invariants()
    assert cache.lookup(ns, tokens) is None
    assert cache.evicted_reach(ns, [*tokens, 99]) == 32  # whole blocks of 16
    assert cache.evicted_reach(Namespace("m", "float32", "other"), tokens) == 0
    assert cache.evicted_reach(ns, tokens, [image(4, 8)]) == 0  # an image where the evicted entry had text


def test_a_query_with_the_evicted_entrys_image_reaches_past_it():
    cache = PrefixCache()
    ns = Namespace("m", "float32", "")
    tokens = list(range(1, 41))
    cache.insert(ns, tokens, [normal(40)], media=[image(4, 8, "img-a")])
    cache.evict()
    assert cache.evicted_reach(ns, tokens, [image(4, 8, "img-a")]) == 32
    assert cache.evicted_reach(ns, tokens, [image(4, 8, "img-b")]) == 0
