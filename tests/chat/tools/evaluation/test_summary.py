"""Summary figures from records: percentiles, ratios, exact-match rate, error counts."""

from __future__ import annotations

import pytest

from chat.tools.evaluation.summary import format_summary, percentile, summarize


def ok(cid: str, turn: int, prompt: int, cached: int, ttft: float, tps: float, completion: int = 5, match=None):
    return {
        "id": cid, "turn": turn, "usage": {"prompt_tokens": prompt, "cached_tokens": cached,
                                           "completion_tokens": completion},
        "timings": {"ttft_ms": ttft, "decode_tokens_per_s": tps, "total_ms": 1.0}, "exact_match": match,
        "error": None,
    }  # fmt: skip


def failed(cid: str, turn: int, code: str, match=None):
    return {"id": cid, "turn": turn, "usage": None, "timings": None, "exact_match": match, "error": {"code": code}}


def test_percentile_interpolates_between_ranks():
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(1, 21))), 95) == pytest.approx(19.05)


def test_summary_numbers():
    records = [
        ok("a", 0, 10, 0, ttft=10.0, tps=100.0, match=True),
        ok("a", 1, 20, 15, ttft=20.0, tps=200.0, match=False),
        ok("b", 0, 10, 5, ttft=30.0, tps=50.0, completion=1),  # 1 token: no decode rate
        failed("b", 1, "invalid_media", match=False),
        failed("c", 0, "connect_failed"),
    ]
    s = summarize(records)
    assert (s.conversations, s.conversations_with_errors, s.turns, s.errors) == (3, 2, 5, 2)
    assert s.error_codes == {"invalid_media": 1, "connect_failed": 1}
    assert s.ttft_p50_ms == 20.0 and s.ttft_p95_ms == pytest.approx(29.0)
    assert s.cached_ratio == pytest.approx(20 / 40) and s.cached_ratio_later == pytest.approx(15 / 20)
    assert s.decode_tokens_per_s == 150.0
    assert (s.references, s.exact_matches, s.exact_match_rate) == (3, 1, pytest.approx(1 / 3))
    table = format_summary(s)
    assert "invalid_media 1" in table and "1 of 3 turns with a reference" in table


def test_summary_of_nothing_shows_dashes():
    s = summarize([])
    assert s.turns == 0 and s.ttft_p50_ms is None and s.exact_match_rate is None
    assert "-" in format_summary(s) and "no references" in format_summary(s)
