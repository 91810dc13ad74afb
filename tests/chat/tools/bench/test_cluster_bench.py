"""`bench cluster` (chat/tools/bench/cluster_bench.py): its figures from client-side records, without Ray (the whole
benchmark against a live cluster: tests/chat/cluster/test_live.py)."""

import math

import pytest

from chat.tools.bench.cluster_bench import MODES, TARGETS, ClusterTurn, summarize
from chat.tools.bench.multiturn_bench import MultiTurnConfig


def test_a_turn_stayed_when_its_cache_covers_the_previous_prompt():
    cfg = MultiTurnConfig(conversations=2, turns_per_conversation=3)
    affine = [
        ClusterTurn(0, 0, 300, 0, 10.0),
        ClusterTurn(0, 1, 700, 310, 10.0),  # 310 >= 300: the previous turn's replica
        ClusterTurn(0, 2, 1000, 705, 10.0),
        ClusterTurn(1, 0, 400, 0, 10.0),
        ClusterTurn(1, 1, 800, 410, 10.0),
        ClusterTurn(1, 2, 1200, 0, 10.0),  # moved: nothing of its conversation here
    ]
    rr = [
        ClusterTurn(0, 0, 300, 0, 10.0),
        ClusterTurn(0, 1, 700, 20, 10.0),  # another replica: the system prompt only
        ClusterTurn(0, 2, 1000, 310, 10.0),  # back where turn 0 ran: less than turn 1's prompt
        ClusterTurn(1, 0, 0, 0, None, "ConnectionLost: gone"),  # failed: the conversation stopped there
    ]
    result = summarize(cfg, {"affine": affine, "round_robin": rr})
    assert result["stayed_share_affine"] == pytest.approx(3 / 4)
    assert result["stayed_share_round_robin"] == 0.0
    assert result["errors"] == 1
    assert result["cached_token_ratio_round_robin"] == pytest.approx((20 + 310) / (300 + 700 + 1000))


def test_the_summary_has_each_modes_keys_the_median_ttft_and_the_gain_of_affine_over_round_robin():
    cfg = MultiTurnConfig(conversations=1, turns_per_conversation=2)
    affine = [ClusterTurn(0, 0, 100, 0, 30.0), ClusterTurn(0, 1, 200, 150, 10.0)]
    rr = [ClusterTurn(0, 0, 100, 0, 50.0), ClusterTurn(0, 1, 200, 50, 20.0), ClusterTurn(1, 0, 100, 0, 40.0)]
    result = summarize(cfg, {mode: records for (mode, _), records in zip(MODES, (affine, rr), strict=True)})
    per_mode = {"cached_token_ratio", "ttft_p50_ms", "cached_token_ratio_per_turn", "stayed_share"}
    assert set(result) == {"errors", "ratio_gain"} | {f"{key}_{mode}" for key in per_mode for mode, _ in MODES}
    assert result["ttft_p50_ms_affine"] == 20.0 and result["ttft_p50_ms_round_robin"] == 40.0  # medians
    assert result["cached_token_ratio_per_turn_affine"] == [0.0, 0.75]
    assert result["cached_token_ratio_round_robin"] == pytest.approx(50 / 400)
    assert result["ratio_gain"] == pytest.approx((150 / 300) / (50 / 400))
    assert {"errors", "ratio_gain", "cached_token_ratio_affine"} <= set(TARGETS)


def test_no_cache_hit_under_round_robin_makes_the_gain_infinite_and_no_first_token_a_nan_median():
    cfg = MultiTurnConfig(conversations=1, turns_per_conversation=1)
    result = summarize(
        cfg, {"affine": [ClusterTurn(0, 0, 100, 10, 5.0)], "round_robin": [ClusterTurn(0, 0, 100, 0, None)]}
    )
    assert result["ratio_gain"] == math.inf and math.isnan(result["ttft_p50_ms_round_robin"])
    assert math.isnan(result["stayed_share_affine"])  # no turn after a first one
