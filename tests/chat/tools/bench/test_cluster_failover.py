"""chat/tools/bench/cluster_failover.py without Ray: the figures of bench cluster's ingress phases from their records,
and a session conversation's resend after a lost connection, over a fake client (the phases themselves run against a
live cluster, in ``bench cluster`` only: minutes on 2 cores)."""

import asyncio
from types import SimpleNamespace
from typing import ClassVar

import pytest

from chat.tools.bench.cluster_failover import SERVICE_RESTART, Failover, _ratio, _session_conversation, _tokens_per_s
from chat.tools.bench.cluster_workload import ClusterTurn
from chat.tools.bench.multiturn_bench import Turn

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


class FakeClient:
    """The chat client as a session conversation uses it; each ``send`` plays the next of ``script``'s outcomes."""

    script: ClassVar[list] = []  # prompt token counts (the turn ran) or exceptions (raised after a first delta)
    opened: ClassVar[list] = []  # every client made, in order

    def __init__(self, url: str, timeout: float) -> None:
        self.resumed = None
        FakeClient.opened.append(self)

    async def connect(self):
        return self

    async def close(self) -> None:
        pass

    async def create_session(self, system, sampling):
        return SimpleNamespace(id="s-1")

    async def resume_session(self, session_id: str) -> None:
        self.resumed = session_id

    async def update_session(self, sampling) -> None:
        pass

    def send(self, text: str):
        return FakeStream(FakeClient.script.pop(0))


class FakeStream:
    def __init__(self, outcome) -> None:
        self.outcome, self.reply = outcome, None

    def __aiter__(self):
        return self._events()

    async def _events(self):
        yield "delta"
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        self.reply = SimpleNamespace(prompt_tokens=self.outcome, cached_tokens=self.outcome // 2, completion_tokens=1)


def test_a_session_conversation_resends_a_turn_cut_by_a_lost_ingress_once_and_counts_what_it_could_not(monkeypatch):
    from chat.tools.client import BusyError, ConnectionLost

    monkeypatch.setattr("chat.tools.client.AsyncChatClient", FakeClient)
    FakeClient.opened = []
    FakeClient.script = [
        ConnectionLost("ingress died", close_code=SERVICE_RESTART),  # turn 0, cut by the dead ingress: resent
        100,  # turn 0 again, on a new connection that resumed the session
        ConnectionLost("network", close_code=1006),  # turn 1, cut otherwise: resent
        ConnectionLost("network", close_code=1006),  # turn 1 again: lost, the conversation stops
    ]
    turns = [Turn("first", 1, 4), Turn("second", 1, 4), Turn("never sent", 1, 4)]
    out, sessions = Failover([]), {}
    asyncio.run(_session_conversation("ws://x", 1, turns, out, sessions, kill=None))
    assert sessions == {1: "s-1"}
    assert [(r.turn, r.prompt_tokens, r.cached_tokens) for r in out.records] == [(0, 100, 50)]
    assert (out.typed_stream_errors, out.other_errors, out.lost_turns) == (1, 2, 1)
    assert [client.resumed for client in FakeClient.opened] == [None, "s-1", "s-1"]  # each reconnect resumed it

    FakeClient.opened, FakeClient.script = [], [BusyError("busy", "a turn is running")]
    out = Failover([])
    asyncio.run(_session_conversation("ws://x", 2, turns, out, {}, kill=None))
    assert (out.other_errors, out.lost_turns) == (1, 1) and out.records[0].error == "BusyError: busy: a turn is running"
