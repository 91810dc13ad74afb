"""chat.engine.drafts: prompt-lookup drafts (what followed the latest earlier occurrence of the tail) and the draft
length that adapts to how drafts do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.engine.drafts import DraftLength, PromptLookup


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_tail():
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 6, 7])
    lookup.extend([2, 3])
    assert lookup.draft(3) == [6, 7, 2]  # the trigram (7, 2, 3) is new; (2, 3) last came before 6
    assert lookup.draft(1) == [6]
    assert lookup.draft(0) == []
    lookup.extend([6])
    assert lookup.draft(5) == [7, 2, 3, 6]  # (2, 3, 6) before: runs up to the end of the sequence


def test_no_draft_for_a_tail_never_seen_before():
    lookup = PromptLookup([1, 2, 3])
    assert lookup.draft(4) == []  # 3 occurs only as the tail
    lookup.extend([8])
    assert lookup.draft(4) == []
    assert PromptLookup().draft(4) == []


def test_a_repeating_reply_drafts_a_whole_period():
    lookup = PromptLookup([10, 11])
    lookup.extend([5, 6, 7, 8, 5, 6, 7, 8, 5])
    assert lookup.draft(4) == [6, 7, 8, 5]


def test_the_draft_length_adapts_to_how_drafts_do():
    length = DraftLength(4)
    assert (length.now, length.min_ngram) == (4, 1)
    length.update(4, 0)
    length.update(3, 1)  # partly accepted: unchanged
    assert length.now == 3
    for _ in range(5):
        length.update(length.now, 0)
    assert (length.now, length.min_ngram) == (1, 2)  # one token, and only on a 2-token match
    length.update(1, 1)
    assert length.now == 3
    length.update(3, 3)
    assert length.now == 4  # capped
    length.update(0, 0)  # no draft: unchanged
    assert length.now == 4


def test_a_minimum_match_length_skips_single_token_matches():
    lookup = PromptLookup([1, 2, 3, 9, 3])
    assert lookup.draft(2) == [9, 3]
    assert lookup.draft(2, min_ngram=2) == []


def reference_draft(seq: list[int], k: int, min_ngram: int = 1, max_ngram: int = 3) -> list[int]:
    """The definition: for the longest tail first, the tokens after its latest earlier occurrence."""
    if k <= 0:
        return []
    for n in range(min(max_ngram, len(seq)), max(min_ngram, 1) - 1, -1):
        tail = seq[len(seq) - n :]
        for start in range(len(seq) - n - 1, -1, -1):  # an occurrence followed by at least one token
            if seq[start : start + n] == tail:
                return seq[start + n : start + n + k]
    return []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=30),
    st.lists(st.lists(st.integers(0, 3), max_size=5), max_size=4),
    st.integers(0, 6),
    st.integers(1, 3),
)
def test_drafts_agree_with_the_definition_as_the_sequence_grows(prompt, pieces, k, min_ngram):
    lookup = PromptLookup(prompt)
    seq = list(prompt)
    for piece in [[], *pieces]:
        lookup.extend(piece)
        seq += piece
        assert lookup.tokens == seq
        assert lookup.draft(k, min_ngram) == reference_draft(seq, k, min_ngram)
