"""The ingress's RemoteEngine over a fake deployment handle: no Ray cluster, Ray's error classes only."""

import asyncio

import pytest

pytest.importorskip("ray", reason="the cluster extra (turncache[cluster]) is not installed")

from ray.exceptions import ActorDiedError

from chat.cluster.remote_engine import RemoteEngine, SessionTracker, SocketEngine
from chat.cluster.routing import RoutingTable, SessionRef, rendezvous
from chat.cluster.wire import Failed, ReplicaLostError, Served
from chat.engine.errors import ContextOverflowError
from chat.engine.events import Delta, Done, Timings, TurnRequest, Usage
from chat.protocol.client_events import TurnCreate
from chat.protocol.store import InMemorySessionStore

DONE = Done("hi there", (1, 2), "stop", Usage(10, 4, 2), Timings(1.0, 1.0, 1.0, 2.0))


class FakeStream:
    """What ``handle.options(stream=True).run_turn.remote(call)`` returns: items, then maybe an error."""

    def __init__(self, items, error=None):
        self.items, self.error, self.cancelled = list(items), error, False

    def __aiter__(self):
        return self._run()

    async def _run(self):
        for item in self.items:
            await asyncio.sleep(0)
            yield item
        if self.error is not None:
            raise self.error

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    def __init__(self, stream):
        self.stream = stream
        self.calls = []  # (method, args)

    def options(self, **_):
        return self

    def __getattr__(self, method):
        handle = self

        class Method:
            def remote(self, *args):
                handle.calls.append((method, args))
                return handle.stream if method == "run_turn" else asyncio.sleep(0)

        return Method()


def engine(stream):
    table = RoutingTable()
    table.replicas_changed(["r1", "r2"])
    return RemoteEngine(FakeHandle(stream), runtime=object(), table=table, keyer=None), table


def collect(remote, session=None):
    async def run():
        return [e async for e in remote.generate(TurnRequest([{"role": "user", "content": "hi"}]), session)]

    return asyncio.run(run())


def test_a_turn_streams_the_replicas_events_and_is_logged():
    remote, table = engine(FakeStream([Served("r1", "node", 7), Delta("hi", (1,)), DONE]))
    events = collect(remote, SessionRef("s1"))
    assert events == [Delta("hi", (1,)), DONE]
    (entry,) = remote.log
    assert (entry.session_id, entry.replica, entry.cached_tokens, entry.prompt_tokens) == ("s1", "r1", 4, 10)
    assert remote.nodes == {"r1": "node"} and table.inflight() == 0


def test_a_replica_that_dies_mid_turn_ends_it_with_a_typed_error_and_leaves_routing():
    stream = FakeStream([Served("r1", "node", 7), Delta("hi", (1,))], error=ActorDiedError())
    remote, table = engine(stream)
    events = collect(remote)
    assert events[0] == Delta("hi", (1,))
    assert events[-1].finish_reason == "error" and isinstance(events[-1].error, ReplicaLostError)
    assert events[-1].error.replica == "r1" and remote.lost_turns == 1
    assert table.live() == ("r2",) and stream.cancelled  # never routed to again; the call given up


def test_an_engine_refusal_is_raised_as_itself():
    refusal = Failed.of(ContextOverflowError(9000, 4096))
    remote, _ = engine(FakeStream([Served("r1", "node", 7), refusal]))
    with pytest.raises(ContextOverflowError, match="9000 tokens"):
        collect(remote)


def test_a_stream_that_ends_without_done_is_a_lost_turn():
    remote, _ = engine(FakeStream([Served("r1", "node", 7)]))
    (done,) = collect(remote)
    assert isinstance(done.error, ReplicaLostError)


def test_submit_delivers_events_then_the_lost_replica_error_to_the_sink():
    remote, _ = engine(FakeStream([Served("r1", "node", 7), Delta("a", (1,))], error=ActorDiedError()))
    got = []

    async def run():
        job = remote.submit(TurnRequest([{"role": "user", "content": "hi"}]), got.append)
        await job.task

    asyncio.run(run())
    assert got[0] == Delta("a", (1,)) and isinstance(got[1], ReplicaLostError) and len(got) == 2


def test_a_cancel_after_the_replica_announced_itself_goes_to_that_replica():
    remote, _ = engine(FakeStream([Served("r1", "node", 7), Delta("a", (1,)), DONE]))
    handle = remote._handle
    got = []

    async def run():
        job = remote.submit(TurnRequest([{"role": "user", "content": "hi"}]), got.append)
        while job.replica is None:
            await asyncio.sleep(0)
        job.cancel()
        await job.task
        await asyncio.sleep(0)

    asyncio.run(run())
    (cancel,) = [args for method, args in handle.calls if method == "cancel_turn"]
    assert cancel[0].replica == "r1" and got[-1] == DONE


def test_a_cancel_before_any_replica_was_asked_ends_cancelled_without_a_call():
    remote, _ = engine(FakeStream([Served("r1", "node", 7), DONE]))
    got = []

    async def run():
        job = remote.submit(TurnRequest([{"role": "user", "content": "hi"}]), got.append)
        job.cancel()  # before the task ran at all
        await job.task

    asyncio.run(run())
    assert [e.finish_reason for e in got] == ["cancelled"]
    assert not [m for m, _ in remote._handle.calls if m == "run_turn"]


def test_a_session_turn_is_claimed_once():
    remote, _ = engine(FakeStream([]))
    store = InMemorySessionStore()
    tracker = SessionTracker(store)
    session = tracker.create("tiny-llama")
    assert tracker.bound is session and remote.claim(session) is None  # idle: nothing to claim
    session.create_turn(TurnCreate(type="turn.create", content="hello"))
    assert remote.claim(session) == SessionRef(session.id)
    assert remote.claim(session) is None  # a completion.create sent during the turn is stateless
    other_socket = SessionTracker(store)
    assert other_socket.get(session.id) is session and remote.claim(other_socket.bound) is None


def test_a_socket_engine_tags_only_its_sessions_turns():
    remote, _ = engine(FakeStream([]))
    seen = []
    remote.submit = lambda request, sink, session=None: seen.append(session)
    tracker = SessionTracker(InMemorySessionStore())
    socket = SocketEngine(remote, tracker)
    request = TurnRequest([{"role": "user", "content": "hi"}])
    socket.submit(request, print)  # no session bound: stateless
    session = tracker.create("tiny-llama")
    session.create_turn(TurnCreate(type="turn.create", content="hello"))
    socket.submit(request, print)
    assert seen == [None, SessionRef(session.id)]
    assert socket.runtime is remote.runtime


def test_pauses_and_resumes_go_to_the_turns_replica_in_the_order_they_were_made():
    remote, _ = engine(FakeStream([Served("r1", "node", 7), Delta("a", (1,)), DONE]))
    applied = []  # (replica, on) in the order the replica would apply them

    class Slow:  # the first call takes longest: sent all at once, the replica would see them out of order
        def __init__(self) -> None:
            self.delays = [0.05, 0.0, 0.0]

        def remote(self, target, call_id, on):
            async def reach():
                await asyncio.sleep(self.delays.pop(0))
                applied.append((target.replica, on))

            return reach()

    remote._handle.pause_turn = Slow()

    async def run():
        job = remote.submit(TurnRequest([{"role": "user", "content": "hi"}]), lambda e: None)
        while job.replica is None:
            await asyncio.sleep(0)
        job.pause()
        job.pause()  # already paused: no second call
        job.resume()
        job.pause()
        await job.flow
        await job.task

    asyncio.run(run())
    assert applied == [("r1", True), ("r1", False), ("r1", True)]


def test_a_pause_before_the_replica_is_known_is_sent_once_it_announces_itself():
    remote, _ = engine(FakeStream([Served("r1", "node", 7), Delta("a", (1,)), DONE]))
    handle = remote._handle

    async def run():
        job = remote.submit(TurnRequest([{"role": "user", "content": "hi"}]), lambda e: None)
        job.pause()  # the stream has not started: no replica yet
        assert [m for m, _ in handle.calls if m == "pause_turn"] == []
        await job.task
        await job.flow
        return job

    job = asyncio.run(run())
    (call,) = [args for method, args in handle.calls if method == "pause_turn"]
    assert (call[0].replica, call[1], call[2]) == ("r1", job.call_id, True)


def test_a_replica_pauses_and_resumes_the_turn_it_runs_and_says_whether_it_ran_there():
    from chat.cluster.replica import EngineReplica
    from chat.cluster.wire import ToReplica

    class Job:
        paused = False

        def pause(self):
            self.paused = True

        def resume(self):
            self.paused = False

    replica = EngineReplica.__new__(EngineReplica)  # the control call's part, without a model or Ray Serve
    job = Job()
    replica.running = {"c1": job}

    async def run():
        here = await replica.pause_turn(ToReplica("r1"), "c1", True)
        paused = job.paused
        await replica.pause_turn(ToReplica("r1"), "c1", False)
        return here, paused, await replica.pause_turn(ToReplica("r1"), "c9", True)

    assert asyncio.run(run()) == (True, True, False) and not job.paused


def test_a_turn_sent_to_a_replica_already_gone_is_sent_on_to_the_next_one_unseen_by_the_client():
    """The replica died between turns; the router did not know yet: nothing began there, so the next replica of the
    turn's order runs it, and the client sees only that replica's events."""
    table = RoutingTable()
    table.replicas_changed(["r1", "r2"])
    gone, alive = FakeStream([], error=ActorDiedError()), FakeStream([Served("r2", "node", 8), Delta("hi", (1,)), DONE])
    sent_to = []

    class RoutingHandle(FakeHandle):
        def __getattr__(self, method):
            def remote(call):
                decision = table.choose(call.route, table.live())  # what the router does
                sent_to.append(decision.replica)
                return gone if decision.replica == "r1" else alive

            return type("Method", (), {"remote": staticmethod(remote)})()

    remote = RemoteEngine(RoutingHandle(None), runtime=object(), table=table, keyer=None)
    session = SessionRef(next(f"s{i}" for i in range(100) if rendezvous(f"session:s{i}", ["r1", "r2"])[0] == "r1"))
    events = collect(remote, session)
    assert sent_to == ["r1", "r2"] and events == [Delta("hi", (1,)), DONE]
    assert remote.lost_turns == 0 and table.live() == ("r2",) and table.inflight() == 0
