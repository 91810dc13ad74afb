"""RemoteEngine: what the ingress's app (``chat.server.app.create_app``) calls its engine, running turns on replicas.

It offers the engine surface the server uses (``runtime``, ``generate``, ``submit``, ``active_turns``,
``metrics``, ``cache_stats``, ``close``), so the HTTP routes, the WebSocket protocol and their auth checks are the
single-process server's own code. A turn becomes a :class:`TurnCall` streamed from an ``EngineReplica``: the
router (:mod:`chat.cluster.ray_router`) picks the replica from the call's :class:`RouteKey`.

Session turns carry their session id: each WebSocket gets a :class:`SocketEngine` over the shared RemoteEngine and a
:class:`SessionTracker` over the shared session store; the tracker sees which session the socket's protocol state
machine is bound to, and a turn submitted while that session has a turn in progress that no socket has claimed yet
is that session's turn (``completion.create`` turns are stateless).

Faults: a replica that dies (or becomes unreachable) while it runs a turn ends that turn with
:class:`ReplicaLostError`; the table never routes to it again, and its keys go to the next replica of their order
(rendezvous hashing). A turn sent to a replica that was already gone (nothing began there) is sent on, up to
``START_RETRIES`` times, to the next one: the client sees nothing of it.
The session store is the ingress's, so the conversation is intact; the next turn re-prefills it on its new replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import RequestCancelledError

from chat.cluster.prompt_keys import PromptKeyer
from chat.cluster.routing import RouteKey, RoutingTable, SessionRef
from chat.cluster.wire import Failed, ReplicaLostError, ReplicaReport, Served, ToReplica, TurnCall
from chat.engine.errors import EngineError
from chat.engine.events import Done, Event, Timings, TurnRequest, Usage
from chat.engine.metrics import Metrics
from chat.engine.runtime import ChatRenderer
from chat.protocol.session import Session

log = logging.getLogger("turncache.cluster")
Sink = Callable[[Event | BaseException], None]
MAX_CLAIMED = 100_000  # sessions whose last claimed turn id is remembered
ROUTING_LOG = 10_000  # turns kept in the routing log
REPORT_TIMEOUT_S = 5.0  # how long /metrics waits for a replica's report
START_RETRIES = 2  # times a turn whose replica was gone before it began is sent on to the next replica


@dataclass(frozen=True, slots=True)
class Routed:
    """One turn in the routing log."""

    call_id: str
    session_id: str | None  # None: stateless
    replica: str  # who ran it
    cached_tokens: int | None  # None when the turn did not finish normally
    prompt_tokens: int | None


@dataclass(eq=False)
class RemoteJob:
    """A submitted turn; ``cancel`` stops it (its events still end with a Done, or an error)."""

    task: asyncio.Task | None = None  # drives the turn's stream
    stream: object | None = field(default=None, repr=False)  # the replica's stream, once the call is made
    replica: str | None = None  # set once the replica announced itself
    call_id: str = ""
    cancelled: bool = False  # cancel() was called
    on_cancel: Callable[[RemoteJob], None] | None = field(default=None, repr=False)
    paused: bool = False  # pause() was called and resume() not since
    on_pause: Callable[[RemoteJob, bool], None] | None = field(default=None, repr=False)  # told each change
    flow: asyncio.Task | None = field(default=None, repr=False)  # the last pause or resume call sent (in order)

    def cancel(self) -> None:
        """Stop at the replica's next step (event loop thread only)."""
        if not self.cancelled:
            self.cancelled = True
            if self.on_cancel is not None:
                self.on_cancel(self)

    def pause(self) -> None:
        """Pause the turn in its replica's engine (its client fell behind: ``chat.server.transport.backpressure``);
        sent once the replica has announced itself (event loop thread only)."""
        if not self.paused and not self.cancelled:
            self.paused = True
            if self.on_pause is not None:
                self.on_pause(self, True)

    def resume(self) -> None:
        """Let a paused turn go on (event loop thread only)."""
        if self.paused:
            self.paused = False
            if self.on_pause is not None:
                self.on_pause(self, False)


class RemoteEngine:
    def __init__(self, handle, runtime: ChatRenderer, table: RoutingTable, keyer: PromptKeyer | None) -> None:
        self.runtime = runtime  # the model's name, modalities and chat template (engine_messages, prompt keys)
        self.table = table  # shared with this process's router
        self.keyer = keyer  # None: no prefix keys (round robin)
        self.metrics = Metrics()  # unused by the cluster's /metrics (replicas report theirs); kept for the server
        self._handle = handle  # the EngineReplica deployment
        self._stream = handle.options(stream=True)  # for run_turn
        self._claimed: OrderedDict[str, str] = OrderedDict()  # session id -> its last turn id sent to a replica
        self.log: deque[Routed] = deque(maxlen=ROUTING_LOG)  # recent turns and where they ran
        self.nodes: dict[str, str] = {}  # replica -> the Ray node it runs on, as replicas announced themselves
        self.lost_turns = 0  # turns ended by a lost replica
        self._tasks: set[asyncio.Task] = set()  # running turn and cancel tasks (asyncio keeps only weak references)

    # ---------------------------------------------------------------- the engine surface

    async def generate(self, request: TurnRequest, session: SessionRef | None = None) -> AsyncIterator[Event]:
        """Delta ... Done, as ``Engine.generate``; a lost replica ends the turn with a Done whose ``error`` is a
        :class:`ReplicaLostError` (so a stream that began can still end with a typed error).

        Raises:
            EngineError: the replica's engine refused the turn before computing (context overflow, bad media...).
        """
        try:
            async for event in self._turn(request, session, RemoteJob()):
                yield event
        except ReplicaLostError as exc:
            yield _ended("error", exc)

    def submit(self, request: TurnRequest, sink: Sink, session: SessionRef | None = None) -> RemoteJob:
        """Run a turn; ``sink`` gets its events on the event loop, then possibly an EngineError (a
        :class:`ReplicaLostError` when its replica was lost). Returns a handle to cancel it."""
        job = RemoteJob(call_id=uuid.uuid4().hex, on_cancel=self._cancel, on_pause=self._pause)
        job.task = self._spawn(self._drive(request, sink, session, job))
        return job

    def active_turns(self) -> int:
        return self.table.inflight()

    def cache_stats(self):
        return None  # each replica reports its own cache (see /metrics)

    def close(self) -> None:
        """Nothing to release here: replicas belong to Ray Serve."""

    # ---------------------------------------------------------------- sessions

    def claim(self, session: Session | None) -> SessionRef | None:
        """``session``'s reference if it has a turn in progress that was not sent yet (it is then marked sent)."""
        if session is None or session.turn_id is None or self._claimed.get(session.id) == session.turn_id:
            return None
        self._claimed[session.id] = session.turn_id
        self._claimed.move_to_end(session.id)
        while len(self._claimed) > MAX_CLAIMED:
            self._claimed.popitem(last=False)
        return SessionRef(session.id)

    # ---------------------------------------------------------------- replicas

    async def describe(self) -> dict:
        """The model and identity of one replica (also makes Ray Serve build this process's router)."""
        return await _call(self._handle.describe)

    async def reports(self) -> list[ReplicaReport]:
        """Every live replica's report; a replica that does not answer within REPORT_TIMEOUT_S is left out."""

        async def one(replica: str) -> ReplicaReport | None:
            try:
                return await asyncio.wait_for(_call(self._handle.report, ToReplica(replica)), REPORT_TIMEOUT_S)
            except (TimeoutError, RayError) as exc:
                log.warning("replica %s did not report: %s", replica, type(exc).__name__)
                return None

        found = await asyncio.gather(*(one(r) for r in self.table.live()))
        unique = {r.replica: r for r in found if r is not None}  # a replica answers with its own id
        self.nodes.update((r.replica, r.node) for r in unique.values())
        return [unique[r] for r in sorted(unique)]

    # ---------------------------------------------------------------- internals

    async def _turn(self, request: TurnRequest, session: SessionRef | None, job: RemoteJob) -> AsyncIterator[Event]:
        """The turn's events. Raises the engine's refusal (EngineError) or ReplicaLostError."""
        job.call_id = job.call_id or uuid.uuid4().hex
        digests: tuple[int, ...] = ()
        opening: int | None = None
        if self.keyer is not None:
            digests, opening = await asyncio.to_thread(self.keyer.keys, request.messages, request.salt)
        if job.cancelled:  # before any replica was asked: nothing was computed
            yield _ended("cancelled")
            return
        for attempt in range(START_RETRIES + 1):
            stream = job.stream = _call(
                self._stream.run_turn, TurnCall(RouteKey(job.call_id, session, digests, opening), request)
            )
            done: Done | None = None
            try:
                async for item in stream:
                    if isinstance(item, Served):
                        job.replica = item.replica
                        self.nodes[item.replica] = item.node
                        if job.cancelled:
                            self._cancel(job)
                        elif job.paused:  # paused before the replica was known
                            self._pause(job, True)
                    elif isinstance(item, Failed):
                        raise item.error()
                    else:
                        if isinstance(item, Done):
                            done = item
                        yield item
                        if done is not None:
                            return
                raise ReplicaLostError(job.replica)  # the stream ended without a Done
            except RequestCancelledError as exc:
                if not job.cancelled:  # not by us
                    raise ReplicaLostError(job.replica) from exc
                done = _ended("cancelled")  # cancelled while waiting for a replica (see _cancel)
                yield done
                return
            except RayTaskError as exc:  # a bug in the replica's own code
                log.error("turn %s failed on replica %s", job.call_id, job.replica, exc_info=exc)
                raise EngineError(f"internal error; replica {job.replica} logged the details") from exc
            except RayError as exc:  # the replica died or cannot be reached
                lost = job.replica or self.table.assigned(job.call_id)
                if lost is not None:
                    self.table.replica_lost(lost)
                if job.replica is None and attempt < START_RETRIES and not job.cancelled:
                    # it died before the turn began there (nothing was sent to the client): the next replica of
                    # the turn's order runs it
                    log.warning("replica %s was gone before turn %s began; sending it on", lost, job.call_id)
                    self.table.finished(job.call_id)
                    job.call_id = uuid.uuid4().hex
                    continue
                self.lost_turns += 1
                log.warning("turn %s lost with replica %s: %s", job.call_id, job.replica, type(exc).__name__)
                raise ReplicaLostError(job.replica) from exc
            finally:
                self.table.finished(job.call_id)
                if done is None:
                    stream.cancel()  # nobody reads it any more: the replica stops the engine turn
                if job.replica is not None:
                    self.log.append(self._logged(job, session, done))

    async def _drive(self, request: TurnRequest, sink: Sink, session: SessionRef | None, job: RemoteJob) -> None:
        try:
            async for event in self._turn(request, session, job):
                sink(event)
        except EngineError as exc:
            sink(exc)
        except Exception as exc:  # a bug here: the socket reports an internal error for this turn only
            log.error("turn %s failed in the ingress", job.call_id, exc_info=exc)
            sink(exc)

    def _cancel(self, job: RemoteJob) -> None:
        if job.replica is None:  # no replica runs it yet: give up the call (it ends cancelled, see _turn)
            if job.stream is not None:
                job.stream.cancel()
            return
        self._spawn(_quietly(_call(self._handle.cancel_turn, ToReplica(job.replica), job.call_id)))

    def _pause(self, job: RemoteJob, on: bool) -> None:
        """Tell the turn's replica to pause it (``on``) or let it go on; the calls of one turn reach it in the order
        they were made (each waits for the one before). Before the replica is known: sent once it announces itself."""
        if job.replica is None:
            return
        previous, target = job.flow, ToReplica(job.replica)

        async def send() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            await _quietly(_call(self._handle.pause_turn, target, job.call_id, on))

        job.flow = self._spawn(send())

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    def _logged(job: RemoteJob, session: SessionRef | None, done: Done | None) -> Routed:
        ok = done is not None and done.finish_reason != "error"
        usage = done.usage if ok else None
        return Routed(
            job.call_id,
            session.id if session else None,
            job.replica or "",
            usage.cached_tokens if usage else None,
            usage.prompt_tokens if usage else None,
        )


def _ended(reason: str, error: Exception | None = None) -> Done:
    """The Done of a turn that no replica finished: nothing generated, nothing counted."""
    return Done("", (), reason, Usage(0, 0, 0), Timings(0.0, 0.0, 0.0, 0.0), error=error)


def _call(method, *args):
    """``method.remote(*args)``, made outside the Serve request this code may be handling.

    Ray Serve gives every call made while handling a request that request's internal id, and its router matches
    replicas to waiting calls by that id: of two calls in flight from one request (two turns of one WebSocket, the
    reports of one /metrics), the second would never be sent. In an empty context each call gets an id of its own.
    """
    return contextvars.Context().run(method.remote, *args)


async def _quietly(call) -> None:
    with contextlib.suppress(RayError, asyncio.CancelledError):
        await call


class SessionTracker:
    """One WebSocket's view of the shared session store: remembers the session its connection is bound to.

    The protocol's ``Connection`` binds a session through ``create`` (``session.create``) or ``get``
    (``session.resume``); everything is passed through to the store.
    """

    def __init__(self, store) -> None:
        self.store = store  # the ingress's session store
        self.bound: Session | None = None  # the last session this connection created or resumed

    def create(self, *args, **kwargs) -> Session:
        self.bound = self.store.create(*args, **kwargs)
        return self.bound

    def get(self, *args, **kwargs) -> Session:
        self.bound = self.store.get(*args, **kwargs)
        return self.bound

    def __getattr__(self, name: str):
        return getattr(self.store, name)


class SocketEngine:
    """The engine one WebSocket's ``ChatSocket`` sees: the RemoteEngine, with session turns tagged by session."""

    def __init__(self, remote: RemoteEngine, tracker: SessionTracker) -> None:
        self.remote = remote
        self.tracker = tracker
        self.runtime = remote.runtime
        self.metrics = remote.metrics

    def submit(self, request: TurnRequest, sink: Sink) -> RemoteJob:
        return self.remote.submit(request, sink, self.remote.claim(self.tracker.bound))

    def generate(self, request: TurnRequest) -> AsyncIterator[Event]:
        return self.remote.generate(request)

    def active_turns(self) -> int:
        return self.remote.active_turns()

    def cache_stats(self):
        return self.remote.cache_stats()
