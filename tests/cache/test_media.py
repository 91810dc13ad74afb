"""cache.media: tokens and spans checked, the floor of a length under media spans, and index keys that make two
sequences agree up to ``n`` exactly when their tokens and every span starting before ``n`` agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import MediaKind, MediaSpan, SpanError, TokenError
from cache.media import MAX_TOKEN_ID, SpanFloor, check_spans, check_tokens, encode_keys


@st.composite
def sequences(draw, max_len: int = 16) -> tuple[list[int], tuple[MediaSpan, ...]]:
    """Tokens of a small alphabet and disjoint spans of two contents and two kinds."""
    tokens = draw(st.lists(st.integers(0, 2), min_size=1, max_size=max_len))
    cuts = sorted(draw(st.sets(st.integers(0, len(tokens)), max_size=6)))
    spans = tuple(
        MediaSpan(a, b, draw(st.sampled_from([MediaKind.IMAGE, MediaKind.AUDIO])), draw(st.sampled_from(["x", "y"])))
        for a, b in zip(cuts[::2], cuts[1::2], strict=False)
    )
    return tokens, spans


def inside(spans, n: int) -> bool:
    return any(s.start < n < s.end for s in spans)


@settings(max_examples=300, deadline=None)
@given(sequences(), st.integers(0, 17))
def test_the_floor_is_the_largest_length_not_inside_a_span(seq, n):
    _, spans = seq
    want = max(m for m in range(n + 1) if not inside(spans, m))
    assert SpanFloor(spans)(n) == want


@settings(max_examples=300, deadline=None)
@given(sequences(), sequences())
def test_keys_agree_up_to_n_exactly_when_tokens_and_the_spans_before_n_agree(a, b):
    (ta, sa), (tb, sb) = a, b
    ka, kb = encode_keys(ta, sa), encode_keys(tb, sb)
    assert len(ka) == len(ta)
    for n in range(min(len(ta), len(tb)) + 1):
        if inside(sa, n) or inside(sb, n):
            continue  # a cut inside a span is never served (SpanFloor)
        same = ta[:n] == tb[:n] and [s for s in sa if s.start < n] == [s for s in sb if s.start < n]
        assert (ka[:n] == kb[:n]) == same


def test_text_keys_are_the_tokens_and_media_keys_are_negative():
    tokens = [5, 6, 7, 8, 9]
    keys = encode_keys(tokens, (MediaSpan(1, 4, MediaKind.IMAGE, "h"),))
    assert keys[0] == 5 and keys[4] == 9
    assert keys[1] < -(2**32) and keys[2:4].tolist() == [-1 - 7, -1 - 8]  # apart from every text token and head key


def test_tokens_must_be_ids_and_spans_inside_and_apart():
    assert check_tokens(iter([0, MAX_TOKEN_ID])) == [0, MAX_TOKEN_ID]
    for bad in ([], [1, -1], [MAX_TOKEN_ID + 1], [True], [1.0]):
        with pytest.raises(TokenError):
            check_tokens(bad)
    a, b = MediaSpan(4, 6, "image", "h"), MediaSpan(0, 2, "audio", "h")
    assert check_spans([a, b], 6) == (b, a) and a.kind is MediaKind.IMAGE  # sorted; the kind made a MediaKind
    with pytest.raises(SpanError):
        check_spans([a], 5)
    with pytest.raises(SpanError):
        check_spans([a, MediaSpan(5, 7, "image", "g")], 8)
    with pytest.raises(SpanError):
        check_spans(["not a span"], 8)
