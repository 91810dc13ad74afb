"""What travels between the ingress and the engine replicas (pickled by Ray), and the cluster's one error.

A turn: the ingress calls ``EngineReplica.run_turn(TurnCall)`` as a stream and receives ``Served`` (who runs it), then
the engine's own ``Delta`` ... ``Done``, or a ``Failed`` in place of everything after ``Served`` when the engine refused
the turn. Control calls (``cancel_turn``, ``pause_turn``, ``report``) name their replica with :class:`ToReplica` as
their first argument; the router sends them there.

Errors::

    chat.engine.errors.EngineClosedError
    └── ReplicaLostError   the replica running a turn died or became unreachable (HTTP 503 ``unavailable``;
                           on the WebSocket an ``error`` event with code ``internal`` and this message)
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

from chat.cluster.routing import RouteKey
from chat.engine.errors import EngineClosedError, EngineError
from chat.engine.events import Done, TurnRequest


class ReplicaLostError(EngineClosedError):
    code = "replica_lost"

    def __init__(self, replica: str | None) -> None:
        where = f"replica {replica}" if replica else "the replica chosen for it"
        super().__init__(
            f"the turn was cut off: {where} stopped; the conversation is as it was before this turn, "
            "send the turn again"
        )
        self.replica = replica  # the lost replica's id, when the turn had reached one


class RemoteFailure(RuntimeError):
    """An unexpected failure inside a replica (its traceback is in that replica's log)."""


@dataclass(frozen=True, slots=True)
class TurnCall:
    route: RouteKey  # read by the router
    turn: TurnRequest  # run by the replica's engine


@dataclass(frozen=True, slots=True)
class ToReplica:
    replica: str  # the replica a control call is for


@dataclass(frozen=True, slots=True)
class Served:
    """First item of every turn's stream."""

    replica: str  # the replica's id (Ray Serve's unique id)
    node: str  # the Ray node it runs on
    pid: int  # its process


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """A replica's answer to ``report``."""

    replica: str
    node: str
    pid: int
    active_turns: int
    metrics_text: str  # what a single-process server's /metrics shows for this engine


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine refused the turn (an EngineError), carried as data: engine errors do not all survive pickling."""

    module: str  # of the error's class
    name: str  # the class
    message: str
    attributes: dict  # the error's own attributes (``field``, ``item``, ...)

    @classmethod
    def of(cls, exc: EngineError) -> Failed:
        attrs = {k: v for k, v in vars(exc).items() if isinstance(v, str | int | float | bool | type(None))}
        return cls(type(exc).__module__, type(exc).__qualname__, str(exc), attrs)

    def error(self) -> EngineError:
        """The same error class with the same message and attributes; a plain EngineError if it cannot be found."""
        cls = EngineError
        if self.module.startswith("chat."):
            found = getattr(importlib.import_module(self.module), self.name, None)
            if isinstance(found, type) and issubclass(found, EngineError):
                cls = found
        exc = cls.__new__(cls)
        Exception.__init__(exc, self.message)
        vars(exc).update(self.attributes)
        return exc


def portable_done(done: Done) -> Done:
    """``done`` with its error (if any) as a :class:`RemoteFailure`: arbitrary exceptions need not unpickle."""
    if done.error is None:
        return done
    return dataclasses.replace(done, error=RemoteFailure(f"{type(done.error).__name__}: {done.error}"))
