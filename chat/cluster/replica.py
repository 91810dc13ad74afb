"""EngineReplica: the Ray Serve deployment that runs turns. One replica = one process with the model, its prefix
cache and the turn scheduler, built exactly as ``turncache serve`` builds them (``chat.server.main.build_engine``).

A replica holds no session: the ingress sends every turn with its whole conversation (rendered by the session state
machine there), so any replica can run any turn; routing only decides where the cache already holds its prefix.

Methods (called by the ingress through a deployment handle):

- ``run_turn(TurnCall)`` (a stream): ``Served``, then the engine's ``Delta`` ... ``Done``, or ``Failed``.
  If the caller goes away (Ray Serve cancels the call), the engine turn is cancelled within one step.
- ``cancel_turn(ToReplica, call_id)``: stop a running turn; its stream still ends with ``Done`` (``cancelled``).
- ``pause_turn(ToReplica, call_id, on)``: pause a running turn in this engine (its client fell behind reading at the
  ingress, ``chat.server.transport.backpressure``), or let it go on.
- ``report(ToReplica)``: ``ReplicaReport``, whose ``metrics_text`` is this engine's single-process ``/metrics``.
- ``describe()``: model name and the replica's identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

import ray
from ray import serve

from chat.cluster.settings import without_keys
from chat.cluster.wire import Failed, ReplicaReport, Served, ToReplica, TurnCall, portable_done
from chat.engine.engine import JobHandle
from chat.engine.errors import EngineError
from chat.engine.events import Delta, Done
from chat.server.settings import ServerSettings

log = logging.getLogger("turncache.cluster")


def replica_settings(settings: ServerSettings) -> ServerSettings:
    """The settings of a replica's private app (only ``/metrics`` is ever called on it, in-process): no session
    store, and no API key, so its ``/metrics`` answers without a bearer token."""
    return without_keys(settings).model_copy(update={"sessions_db": None})


class EngineReplica:
    def __init__(self, settings: ServerSettings, torch_threads: int) -> None:
        """Raises chat.models' typed errors (the replica then fails to start; Ray Serve reports it)."""
        import torch

        from chat.server.app import create_app
        from chat.server.main import build_engine

        torch.set_num_threads(1)  # this thread only relays: the engine's worker alone runs torch in parallel
        threads = max(1, torch_threads)
        self.engine = build_engine(settings.model_copy(update={"threads": threads}))  # model, cache, scheduler
        self.replica = serve.get_replica_context().replica_id.unique_id  # our id in routing and /metrics
        self.node = ray.get_runtime_context().get_node_id()  # the Ray node we run on
        self.pid = os.getpid()
        self.running: dict[str, JobHandle] = {}  # call id -> engine job, while the turn runs
        # A private single-process app over this engine: its /metrics is what the ingress relabels.
        self.app = create_app(self.engine, replica_settings(settings), model_name=self.engine.runtime.name)

    async def run_turn(self, call: TurnCall) -> AsyncIterator[Served | Delta | Done | Failed]:
        yield Served(self.replica, self.node, self.pid)
        call_id = call.route.call_id
        stream = self.engine.generate(call.turn, on_start=lambda job: self.running.__setitem__(call_id, job))
        try:
            async with contextlib.aclosing(stream) as events:  # closed early: the ingress went away, cancel the turn
                async for item in events:
                    yield portable_done(item) if isinstance(item, Done) else item
        except Exception as exc:  # the engine's refusal or failure, as data the ingress can raise again
            yield Failed.of(exc if isinstance(exc, EngineError) else self._internal(exc))
        finally:
            self.running.pop(call_id, None)

    async def cancel_turn(self, target: ToReplica, call_id: str) -> bool:
        """True when the turn was running here (it then ends with ``Done`` ``cancelled`` on its stream)."""
        job = self.running.get(call_id)
        if job is not None:
            job.cancel()
        return job is not None

    async def pause_turn(self, target: ToReplica, call_id: str, on: bool) -> bool:
        """Pause a running turn (``on``) or let it go on; True when it was running here."""
        job = self.running.get(call_id)
        if job is not None:
            job.pause() if on else job.resume()
        return job is not None

    async def report(self, target: ToReplica) -> ReplicaReport:
        status, body = await asgi_get(self.app, "/metrics")
        text = body.decode() if status == 200 else ""
        return ReplicaReport(self.replica, self.node, self.pid, self.engine.active_turns(), text)

    async def describe(self) -> dict:
        return {"model": self.engine.runtime.name, "replica": self.replica, "node": self.node, "pid": self.pid}

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()

    def _internal(self, exc: BaseException) -> EngineError:
        log.error("turn failed on replica %s", self.replica, exc_info=exc)
        return EngineError(f"internal error; replica {self.replica} logged the details")


async def asgi_get(app, path: str) -> tuple[int, bytes]:
    """GET ``path`` from an ASGI app in this process: (status, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"replica")],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
    }
    status, body = 500, []
    requested, answered = False, asyncio.Event()

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await answered.wait()  # then the client "goes away", as a real one would
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    await app(scope, receive, send)
    return status, b"".join(body)
