"""bench cluster's figures from client-side records (no Ray)."""

import pytest

from chat.tools.bench.cluster_bench import ClusterTurn, summarize
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
