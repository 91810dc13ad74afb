"""The tenants' gate (``chat/server/tenancy/tenant_gate.py``): a request admitted or refused for its tenant's limits
in force (the keys file's over the server's), each refusal and each ended turn counted for ``/metrics``, and the
engine view that stamps a tenant's default priority and reports each turn's end once. (Over HTTP and the WebSocket:
tests/chat/server/test_tenant_limits.py.)"""

from __future__ import annotations

import asyncio

import pytest

from chat.engine.events import Delta, Done, Timings, TurnRequest, Usage
from chat.engine.sampling import SamplingParams
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.tenancy.policy import TenantPolicy
from chat.server.tenancy.ratelimit import Limits, RateLimitedError
from chat.server.tenancy.tenant_gate import TenantFigures, TenantGate


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def gate(file: dict[str, TenantPolicy] | None = None, defaults: TenantPolicy | None = None) -> TenantGate:
    file = file or {}
    return TenantGate(lambda t: file.get(t, TenantPolicy()), defaults or TenantPolicy(), clock=Clock())


def done(prompt: int, cached: int, completion: int) -> Done:
    return Done("x", (1,), "stop", Usage(prompt, cached, completion), Timings(1.0, 1.0, 1.0, 1.0))


def test_the_keys_files_limits_and_priority_over_the_servers_defaults():
    defaults = TenantPolicy(Limits(concurrent_turns=4, open_sessions=9), priority=3)
    g = gate({"alice": TenantPolicy(Limits(concurrent_turns=2), frozenset({"open_sessions"}), -5)}, defaults)
    assert g.terms("alice") == (Limits(concurrent_turns=2), -5)  # open_sessions lifted: no limit
    assert g.terms("bob") == (Limits(concurrent_turns=4, open_sessions=9), 3)
    assert (g.open_sessions("alice"), g.open_sessions("bob")) == (None, 9)


def test_a_request_over_the_minute_is_refused_counted_and_not_recorded():
    g = gate({"alice": TenantPolicy(Limits(requests_per_minute=2))})
    g.admit("alice")
    g.admit("alice")
    with pytest.raises(RateLimitedError) as info:
        g.admit("alice")
    assert info.value.refusal.limit == "requests_per_minute"
    assert g.check("alice") is not None  # checking again refuses again, and counts it
    assert g.figures_of("alice").rate_limited == 2 and g.figures_of("bob") == TenantFigures()
    g.admit("bob")  # another tenant goes on


def test_a_request_that_alone_needs_more_turns_than_the_tenant_may_run_names_n():
    g = gate(defaults=TenantPolicy(Limits(concurrent_turns=2)))
    with pytest.raises(RequestError) as info:
        g.admit("alice", turns=3)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_REQUEST, "n")
    assert g.figures_of("alice").rate_limited == 0  # not a rate limit: waiting would never help
    g.admit("alice", turns=2)


def test_an_ended_turn_is_counted_and_its_tokens_charged_a_failed_one_only_stops_running():
    g = gate({"alice": TenantPolicy(Limits(tokens_per_minute=10))})
    for _ in range(2):
        g.limiter.start_turn("alice")
    assert g.active("alice") == 2
    g.ended("alice", done(prompt=6, cached=4, completion=5))
    g.ended("alice", None)  # failed before computing anything
    assert g.active("alice") == 0
    assert g.figures_of("alice") == TenantFigures(turns=1, prompt_tokens=6, cached_tokens=4, completion_tokens=5)
    assert g.check("alice").limit == "tokens_per_minute"  # 11 tokens charged against 10


class Engine:
    """Records what it is asked to run; its turns end when the test says so."""

    name = "fake"

    def __init__(self) -> None:
        self.requests, self.sinks = [], []

    def submit(self, request, sink):
        self.requests.append(request)
        self.sinks.append(sink)
        return "handle"


def test_the_engine_view_stamps_the_default_priority_and_reports_a_turns_end_once():
    g = gate({"alice": TenantPolicy(priority=7)})
    engine, seen = Engine(), []

    async def scenario():
        view = g.engine_for(engine, "alice")
        assert view.name == "fake" and view.unmetered is engine  # everything else is the engine's
        assert view.submit(TurnRequest([]), seen.append) == "handle"
        view.submit(TurnRequest([], SamplingParams(priority=-2)), seen.append)
        assert g.active("alice") == 2
        first, second = engine.sinks
        first(Delta("a", (1,)))
        first(done(3, 0, 1))
        first(done(3, 0, 1))  # anything after the end is passed on, never counted again
        second(RuntimeError("failed before computing anything"))
        await asyncio.sleep(0.05)  # the ends reach the gate on the loop

    asyncio.run(scenario())
    assert [r.params.priority for r in engine.requests] == [7, -2]  # the request's own priority wins
    assert g.active("alice") == 0 and g.figures_of("alice").turns == 1
    assert len(seen) == 4  # the client's sink got every event
