"""chat/tools/bench/cluster_workload.py: the cluster benchmarks' records and the figures read from them; a
conversation that cannot reach the cluster is one failed record (the workload against a live cluster:
tests/chat/cluster/test_live.py)."""

import asyncio
import contextlib
import math
import socket

import pytest

from chat.tools.bench.cluster_workload import ClusterTurn, ratio, run_workload, stayed_share
from chat.tools.bench.multiturn_bench import Turn


def test_the_ratio_is_cached_over_prompt_tokens_and_zero_without_any():
    records = [ClusterTurn(0, 0, 100, 0, 1.0), ClusterTurn(0, 1, 300, 150, 1.0)]
    assert ratio(records) == pytest.approx(150 / 400)
    assert ratio([]) == 0.0


def test_a_later_turn_stayed_when_its_cached_tokens_cover_its_conversations_previous_prompt():
    records = [
        ClusterTurn(0, 0, 100, 0, 1.0),
        ClusterTurn(0, 1, 200, 100, 1.0),  # stayed: exactly the previous prompt
        ClusterTurn(0, 2, 300, 150, 1.0),  # moved: less than the previous prompt (200)
        ClusterTurn(1, 0, 100, 0, 1.0),
        ClusterTurn(1, 1, 250, 120, 1.0),  # stayed
        ClusterTurn(2, 3, 500, 400, 1.0),  # its previous turn is not among the records: not counted
    ]
    assert stayed_share(records) == pytest.approx(2 / 3)
    assert math.isnan(stayed_share([ClusterTurn(0, 0, 100, 0, 1.0)]))


def test_a_conversation_that_cannot_connect_is_one_failed_record_and_the_others_still_run():
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{s.getsockname()[1]}/v1/ws"  # bound, not listening: connections are refused
        workload = [[Turn("hello", 1, 4), Turn("again", 1, 4)], [Turn("other", 1, 4)]]
        records, wall = asyncio.run(run_workload(url, workload))
    assert sorted(r.conversation for r in records) == [0, 1] and wall >= 0
    for record in records:
        assert (record.turn, record.prompt_tokens, record.ttft_ms) == (0, 0, None)
        assert record.error is not None and record.error.startswith("ConnectFailed: cannot connect")
