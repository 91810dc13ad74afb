"""cache.radix's public helper: :func:`cache.shared_prefix_length` against the plain definition."""

from hypothesis import given
from hypothesis import strategies as st

from cache import shared_prefix_length

TOKENS = st.lists(st.integers(min_value=0, max_value=3), max_size=40)  # a small alphabet: long shared runs


def reference(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(TOKENS, TOKENS)
def test_shared_prefix_length_is_the_plain_count(a, b):
    assert shared_prefix_length(a, b) == reference(a, b) == shared_prefix_length(b, a)


@given(TOKENS, TOKENS)
def test_a_sequence_extended_shares_all_of_itself(a, tail):
    assert shared_prefix_length(a, a + tail) == len(a)
    assert shared_prefix_length(a, a) == len(a)


@given(TOKENS, TOKENS)
def test_key_arrays_lists_and_tuples_give_the_same_count(a, b):
    from array import array

    assert shared_prefix_length(array("q", a), array("q", b)) == shared_prefix_length(tuple(a), b) == reference(a, b)
    assert shared_prefix_length(array("i", a), b) == reference(a, b)  # another typecode is read, not taken as is
