"""Bad input gets a typed error from one hierarchy, and leaves the cache unchanged."""

from __future__ import annotations

import pytest
import torch

from cache import (
    CacheError,
    LeaseError,
    LengthError,
    MediaSpan,
    Namespace,
    NamespaceError,
    NormalKV,
    PrefixCache,
    SpanError,
    TokenError,
)
from tests.cache.helpers import image, normal, recurrent

NS = Namespace("model-a", "float32")


@pytest.fixture
def cache() -> PrefixCache:
    c = PrefixCache()
    c.insert(NS, [1, 2, 3, 4], [normal(4), recurrent({4})])  # fixes the namespace layout
    return c


def snapshot(cache: PrefixCache):
    s = cache.stats()
    return (s.entries, dict(s.bytes_per_tier), s.inserts, cache.entry_ids())


BAD_INSERTS = {
    "fewer layers": lambda: dict(layers=[normal(5)]),
    "layer kind differs": lambda: dict(layers=[recurrent({5}), recurrent({5})]),
    "head shape differs": lambda: dict(
        layers=[NormalKV(torch.zeros(1, 2, 5, 2), torch.zeros(1, 2, 5, 2)), recurrent({5})]
    ),
    "dtype differs": lambda: dict(
        layers=[
            NormalKV(torch.zeros(1, 1, 5, 2, dtype=torch.float64), torch.zeros(1, 1, 5, 2, dtype=torch.float64)),
            recurrent({5}),
        ]
    ),
    "length differs": lambda: dict(layers=[normal(4), recurrent({5})]),
    "no snapshot at the end": lambda: dict(layers=[normal(5), recurrent({3})]),
    "snapshot beyond the end": lambda: dict(layers=[normal(5), recurrent({5, 9})]),
    "span out of range": lambda: dict(media=[image(3, 6)]),
    "spans overlap": lambda: dict(media=[image(0, 3, "a"), image(2, 4, "b")]),
    "negative token": lambda: dict(tokens=[1, -2, 3, 4, 5]),
    "float token": lambda: dict(tokens=[1, 2.0, 3, 4, 5]),
    "empty tokens": lambda: dict(tokens=[]),
    "extras out of order": lambda: dict(extras=[(3, "a"), (1, "b")]),
    "extras beyond the end": lambda: dict(extras=[(6, "a")]),
    "not a namespace": lambda: dict(namespace="model-a"),
    "not a layer state": lambda: dict(layers=[torch.zeros(1), recurrent({5})]),
    "no layers": lambda: dict(layers=[]),
}


@pytest.mark.parametrize("case", sorted(BAD_INSERTS))
def test_bad_insert_raises_a_typed_error_and_changes_nothing(cache, case):
    args = dict(namespace=NS, tokens=[1, 2, 3, 4, 5], layers=[normal(5), recurrent({5})], media=(), extras=())
    args.update(BAD_INSERTS[case]())
    before = snapshot(cache)
    with pytest.raises(CacheError):
        cache.insert(args["namespace"], args["tokens"], args["layers"], media=args["media"], extras=args["extras"])
    assert snapshot(cache) == before
    cache.check_invariants()


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: MediaSpan(-1, 3, "image", "h"), SpanError),
        (lambda: MediaSpan(4, 4, "image", "h"), SpanError),
        (lambda: MediaSpan(0, 4, "smell", "h"), SpanError),
        (lambda: MediaSpan(0, 4, "image", ""), SpanError),
        (lambda: PrefixCache(device_budget_bytes=-1), LengthError),
    ],
)
def test_bad_values_are_refused_when_built(build, error):
    with pytest.raises(error):
        build()


def test_bad_queries_raise_and_count_nothing(cache):
    with pytest.raises(TokenError):
        cache.lookup(NS, [1, "x"])
    with pytest.raises(SpanError):
        cache.lookup(NS, [1, 2, 3], [image(2, 5)])
    assert cache.stats().lookups == 0


def test_a_match_from_another_namespace_or_cache_is_refused(cache):
    match = cache.lookup(NS, [1, 2, 3, 4, 5])
    with pytest.raises(NamespaceError):
        cache.acquire(match, Namespace("model-b", "float32"))
    with pytest.raises(NamespaceError):
        PrefixCache().acquire(match, NS)


def test_a_lease_released_twice_or_elsewhere_is_refused(cache):
    lease = cache.acquire(cache.lookup(NS, [1, 2, 3, 4, 5]), NS)
    with pytest.raises(NamespaceError):
        PrefixCache().release(lease)
    cache.release(lease)
    with pytest.raises(LeaseError):
        cache.release(lease)
    cache.check_invariants()
