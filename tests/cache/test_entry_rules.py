"""cache.entry_rules against the plain definitions (tests/cache/reference.py where it has them): the lengths an entry
can serve, the extras' step function and its checks, and where stored and query media first differ."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import LengthError, MediaKind, MediaSpan, Namespace
from cache.entry_rules import check_extras, exact_media_cut, extra_at, servable, servable_limits
from cache.media import SpanFloor
from tests.cache.helpers import normal, recurrent, rotating, stateless
from tests.cache.reference import RefEntry
from tests.cache.reference import spans_before as ref_spans_before

NS = Namespace("m", "float32")


@st.composite
def spans(draw, length: int) -> tuple[MediaSpan, ...]:
    """Disjoint sorted spans inside [0, length), of two contents."""
    cuts = sorted(draw(st.sets(st.integers(0, length), max_size=6)))
    out = []
    for start, end in zip(cuts[::2], cuts[1::2], strict=False):
        out.append(MediaSpan(start, end, MediaKind.IMAGE, draw(st.sampled_from(["a", "b"]))))
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_servable_lengths_agree_with_the_reference(data):
    length = data.draw(st.integers(1, 30), label="length")
    media = data.draw(spans(length), label="media")
    lo = data.draw(st.integers(0, length), label="lo")
    point_sets = data.draw(
        st.lists(st.sets(st.integers(1, length), min_size=1), max_size=3), label="recurrent layers' snapshots"
    )
    got_lo, points = servable(lo, point_sets, SpanFloor(media))
    common = frozenset.intersection(*map(frozenset, point_sets)) if point_sets else None
    want = RefEntry(1, NS, list(range(length)), media, lo, common, 0, 0, 0).servable()
    if point_sets:
        assert got_lo is None and set(points) == want and list(points) == sorted(points)
    else:  # every length from lo on, the index cutting each query at its media (SpanFloor)
        assert points == () and got_lo == lo


def test_the_limits_are_the_rotating_layers_shortest_length_and_each_recurrent_layers_snapshots():
    margin = rotating(10, 3, rows=4)  # window 3 holding 4 rows of 10: from 6 + 2 = 8 on
    assert servable_limits((margin,)) == (8, [])
    layers = (normal(10), margin, rotating(10, 4), recurrent({4, 10}), recurrent({10}), stateless())
    assert servable_limits(layers) == (10, [{4, 10}, {10}])  # window 4 holding 3 rows: only 10; the tightest wins
    assert servable_limits((rotating(3, 4),)) == (0, [])  # never rolled over: any length
    assert servable_limits((normal(5), stateless())) == (0, [])


def reference_extra(extras, n):
    values = [value for start, value in extras if start <= n]
    return values[-1] if values else None


@given(
    st.lists(st.integers(0, 20), unique=True, max_size=6).map(sorted),
    st.integers(0, 25),
)
def test_the_extra_at_a_length_is_the_value_of_the_last_step_starting_by_it(starts, n):
    extras = check_extras([(start, f"v{start}") for start in starts], 20)
    assert extra_at(extras, n) == reference_extra(extras, n)


@pytest.mark.parametrize(
    "extras",
    [[(0, "a"), (0, "b")], [(3, "a"), (1, "b")], [(-1, "a")], [(11, "a")], [("1", "a")], [(1, "a", "b")], [1]],
    ids=["repeated start", "decreasing", "negative", "past the end", "not an int", "a triple", "not a pair"],
)
def test_extras_that_are_not_increasing_pairs_inside_the_entry_are_refused(extras):
    with pytest.raises(LengthError):
        check_extras(extras, 10)


def test_extras_at_both_ends_of_the_entry_are_taken():
    assert check_extras([(0, "a"), (10, "b")], 10) == ((0, "a"), (10, "b"))
    assert check_extras((), 10) == ()


def reference_cut(stored, query, n):
    a, b = ref_spans_before(stored, n), ref_spans_before(query, n)
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        if x != y:
            return min(s.start for s in (x, y) if s is not None)
    return n


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_exact_cut_is_the_first_span_before_n_where_the_media_differ(data):
    stored = data.draw(spans(30), label="stored")
    query = data.draw(spans(30), label="query")
    n = data.draw(st.integers(0, 30), label="n")
    assert exact_media_cut(stored, query, n) == reference_cut(stored, query, n)
    assert exact_media_cut(stored, stored, n) == n
