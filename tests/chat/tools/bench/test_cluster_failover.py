"""chat/tools/bench/cluster_failover.py: the figures of bench cluster's ingress phases from their records, without
Ray (the phases themselves run against a live cluster, in ``bench cluster`` only: minutes on 2 cores)."""

import pytest

from chat.tools.bench.cluster_failover import _ratio, _tokens_per_s
from chat.tools.bench.cluster_workload import ClusterTurn

RECORDS = [
    ClusterTurn(0, 0, 100, 0, None, None, 5),
    ClusterTurn(0, 1, 300, 100, None, None, 7),
    ClusterTurn(1, 0, 0, 0, None, "ConnectionLost: gone"),
    ClusterTurn(1, 1, 500, 500, None, "ChatError: refused", 9),  # failed: counted nowhere, whatever it holds
]


def test_the_cached_ratio_leaves_failed_turns_out():
    assert _ratio(RECORDS) == pytest.approx(100 / 400)
    assert _ratio([]) == 0.0


def test_tokens_per_second_count_prompt_and_completion_tokens_of_the_turns_that_ran():
    assert _tokens_per_s(RECORDS, 2.0) == pytest.approx((100 + 5 + 300 + 7) / 2.0)
