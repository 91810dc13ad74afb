"""chat/cluster/replica.py without Ray: a replica's turn stream (who serves it first, the engine's events, an engine
error as data, an internal failure as a typed one, the engine turn closed when the caller goes away), its control
calls, its report, and the in-process GET of its private app's /metrics. Replicas in a live cluster: test_live.py."""

import asyncio
import contextlib
from types import SimpleNamespace

from chat.cluster.replica import EngineReplica, asgi_get, replica_settings
from chat.cluster.routing import RouteKey
from chat.cluster.wire import Failed, RemoteFailure, ReplicaReport, Served, ToReplica, TurnCall
from chat.engine.errors import ContextOverflowError, EngineError
from chat.engine.events import Delta, Done, Timings, Usage
from chat.server.settings import ServerSettings

USAGE, TIMINGS = Usage(4, 0, 2), Timings(1.0, 1.0, 10.0, 5.0)


class Job:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def cancel(self) -> None:
        self.calls.append("cancel")

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


class FakeEngine:
    """Streams ``items`` (raising any exception among them) after telling ``on_start`` its job."""

    def __init__(self, items) -> None:
        self.items, self.job, self.closed = items, Job(), False
        self.runtime = SimpleNamespace(name="tiny-llama")

    async def generate(self, turn, on_start):
        on_start(self.job)
        try:
            for item in self.items:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.closed = True

    def active_turns(self) -> int:
        return 3

    def close(self) -> None:  # EngineReplica.__del__ closes its engine
        self.closed = True


def replica(items=(), app=None) -> EngineReplica:
    """An EngineReplica over a fake engine, built without Ray Serve (``__init__`` needs a replica context)."""
    made = EngineReplica.__new__(EngineReplica)
    made.engine, made.replica, made.node, made.pid, made.running, made.app = FakeEngine(items), "r1", "n1", 7, {}, app
    return made


CALL = TurnCall(RouteKey("call-1"), turn=None)


async def collect(stream) -> list:
    return [item async for item in stream]


def test_a_turn_streams_served_then_the_engines_events_and_forgets_the_job_at_the_end():
    done = Done("hi", (1, 2), "stop", USAGE, TIMINGS)
    made = replica([Delta("h", (1,)), Delta("i", (2,)), done])
    items = asyncio.run(collect(made.run_turn(CALL)))
    assert items == [Served("r1", "n1", 7), Delta("h", (1,)), Delta("i", (2,)), done]
    assert made.running == {} and made.engine.closed


def test_a_done_with_an_error_carries_it_as_a_portable_failure():
    done = Done("", (), "error", USAGE, TIMINGS, error=KeyError("unpicklable in general"))
    (_, got) = asyncio.run(collect(replica([done]).run_turn(CALL)))
    assert isinstance(got.error, RemoteFailure) and str(got.error) == "KeyError: 'unpicklable in general'"


def test_an_engine_refusal_is_data_with_its_type_and_an_internal_failure_an_engine_error_naming_the_replica():
    (_, refused) = asyncio.run(collect(replica([ContextOverflowError(90, 64)]).run_turn(CALL)))
    assert isinstance(refused, Failed)
    error = refused.error()
    assert isinstance(error, ContextOverflowError) and (error.prompt_tokens, error.context_window) == (90, 64)
    _, delta, broken = asyncio.run(collect(replica([Delta("a", (1,)), ZeroDivisionError("bug")]).run_turn(CALL)))
    assert delta == Delta("a", (1,)) and type(broken.error()) is EngineError
    assert broken.message == "internal error; replica r1 logged the details"


def test_a_caller_that_goes_away_closes_the_engines_stream():
    made = replica([Delta("a", (1,)), Delta("b", (2,)), Done("ab", (1, 2), "stop", USAGE, TIMINGS)])

    async def read_two() -> list:
        async with contextlib.aclosing(made.run_turn(CALL)) as stream:
            return [await anext(stream), await anext(stream)]

    assert asyncio.run(read_two())[1] == Delta("a", (1,))
    assert made.engine.closed and made.running == {}  # the engine turn ends with the call (cancelled there)


def test_control_calls_reach_a_running_turn_and_say_when_there_is_none():
    made = replica()
    job = Job()
    made.running["call-1"] = job
    target = ToReplica("r1")
    assert asyncio.run(made.pause_turn(target, "call-1", True))
    assert asyncio.run(made.pause_turn(target, "call-1", False))
    assert asyncio.run(made.cancel_turn(target, "call-1"))
    assert job.calls == ["pause", "resume", "cancel"]
    assert not asyncio.run(made.cancel_turn(target, "call-2")) and not asyncio.run(made.pause_turn(target, "x", True))


def asgi_app(status: int, chunks: list[bytes], seen: list):
    async def app(scope, receive, send):
        seen.append((scope["method"], scope["path"], await receive()))
        await send({"type": "http.response.start", "status": status, "headers": []})
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})
        seen.append(await receive())  # after the answer: the client is gone

    return app


def test_the_in_process_get_returns_the_status_and_the_whole_body():
    seen = []
    assert asyncio.run(asgi_get(asgi_app(200, [b"a 1\n", b"b 2\n"], seen), "/metrics")) == (200, b"a 1\nb 2\n")
    (method, path, request), gone = seen
    assert (method, path, request["type"], gone["type"]) == ("GET", "/metrics", "http.request", "http.disconnect")


def test_the_report_holds_the_engines_metrics_text_or_nothing_when_they_failed():
    made = replica(app=asgi_app(200, [b"turncache_turns 1\n"], []))
    report = asyncio.run(made.report(ToReplica("r1")))
    assert report == ReplicaReport("r1", "n1", 7, 3, "turncache_turns 1\n")
    made.app = asgi_app(500, [b"boom"], [])
    assert asyncio.run(made.report(ToReplica("r1"))).metrics_text == ""
    assert asyncio.run(made.describe()) == {"model": "tiny-llama", "replica": "r1", "node": "n1", "pid": 7}


def test_a_replicas_private_app_has_no_session_store_and_no_api_key():
    settings = ServerSettings(sessions_db="s.sqlite3", api_keys="sk-0123456789abcdef tenant-a", model="tiny-llama")
    private = replica_settings(settings)
    assert private.sessions_db is None and private.api_keys is None and private.model == "tiny-llama"
