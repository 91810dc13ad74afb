"""One WebSocket's protocol state, sans I/O: frames in, :class:`Step` out; engine results in, events out.

A transport is a thin loop around it::

    conn = Connection(store, models=["smollm2-135m"])
    for frame in websocket:                          # text or bytes
        step = conn.receive(frame)
        send(step.send)                              # serialize_server_event(e) for each
        for turn_id in step.cancel: engine.cancel(turn_id)
        if step.start: engine.start(step.start)      # then, as the engine reports:
            # send(conn.on_delta(turn_id, text)) ... [send(conn.on_tool_call(turn_id, i, call)) ...]
            # send(conn.on_done(turn_id, text, reason, usage, timings, tool_calls))
    for turn_id in conn.close(): engine.cancel(turn_id)   # and keep feeding on_done for them

The connection acts for one tenant (``tenant``, from the transport's authentication): it creates sessions owned by
it and resumes only those; another tenant's session id gets exactly the answer of an id that does not exist.
The connection is bound to at most one session at a time (``session.create`` / ``session.resume`` replace it) and
runs at most one stateless turn (``completion.create``) at a time. Turns are routed by ``turn_id``, so a turn still
running after the connection switched sessions reports to the session that started it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chat.protocol.client_events import (
    ClientEvent,
    CompletionCreate,
    ConversationGet,
    Ping,
    SessionCreate,
    SessionResume,
    SessionUpdate,
    ToolResults,
    TurnCancel,
    TurnCreate,
    TurnEdit,
    TurnRegenerate,
)
from chat.protocol.content import FinishReason
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.ids import IdFactory, new_id
from chat.protocol.parser import parse_client_event
from chat.protocol.server_events import (
    ErrorEvent,
    Pong,
    ReplyDelta,
    ReplyToolCall,
    ServerEvent,
    SessionCreated,
    SessionResumed,
    Timings,
    Usage,
)
from chat.protocol.session import Session, TurnPlan, plan_completion
from chat.protocol.store import SessionStore
from chat.protocol.tools import AssistantToolCall


@dataclass(frozen=True, slots=True)
class Step:
    """What the transport must do after one client event, in this order: send, cancel, start."""

    send: tuple[ServerEvent, ...] = ()  # events to send now
    cancel: tuple[str, ...] = ()  # turn ids the engine must cancel (each still ends with on_done)
    start: TurnPlan | None = None  # a turn the engine must run (its turn.started is already in `send`)


class Connection:
    """Dispatches client events to the store, the bound session, or the stateless slot."""

    def __init__(
        self, store: SessionStore, models: Sequence[str], new_id: IdFactory = new_id, *, tenant: str = ""
    ) -> None:
        if not models:
            raise ValueError("at least one model must be served")
        self.store = store  # where sessions live
        self.tenant = tenant  # who the client is: owns the sessions it creates, finds only those
        self.models = tuple(models)  # models served here; the first is the default
        self.session: Session | None = None  # the bound session
        self._new_id = new_id  # makes stateless turn ids
        self._stateless: TurnPlan | None = None  # the completion.create turn in progress
        self._turns: dict[str, Session | None] = {}  # running turns started here -> their session (None: stateless)

    def receive(self, raw: str | bytes) -> Step:
        """Parse and handle one frame. Never raises ProtocolError: a refusal becomes an ``error`` event in ``send``."""
        try:
            return self.handle(parse_client_event(raw))
        except ProtocolError as exc:
            return Step(send=(ErrorEvent.of(exc),))

    def handle(self, event: ClientEvent) -> Step:
        """Handle one validated client event.

        Raises:
            ProtocolError: see each event in ``docs/protocol.md``; its ``event_id`` is the event's.
        """
        try:
            return self._dispatch(event)
        except ProtocolError as exc:
            if exc.event_id is None and event.event_id is not None:
                raise ProtocolError(exc.code, exc.message, event.event_id) from None
            raise

    # ---------------------------------------------------------------- engine results

    def on_delta(
        self, turn_id: str, text: str, token_ids: list[int] | None = None, logprobs: list | None = None
    ) -> ReplyDelta:
        """The ``reply.delta`` to send for a turn started on this connection.

        Raises:
            ValueError: ``turn_id`` is not running here (a caller bug).
        """
        session = self._owner(turn_id)
        if session is None:
            return self._stateless_plan(turn_id).delta(text, token_ids, logprobs)
        return session.on_delta(turn_id, text, token_ids, logprobs)

    def on_tool_call(self, turn_id: str, index: int, call: AssistantToolCall) -> ReplyToolCall:
        """The ``reply.tool_call`` to send for one call of a turn's reply, before its ``on_done``.

        Raises:
            ValueError: ``turn_id`` is not running here (a caller bug).
        """
        session = self._owner(turn_id)
        if session is None:
            return self._stateless_plan(turn_id).tool_call(index, call)
        return session.on_tool_call(turn_id, index, call)

    def on_done(
        self,
        turn_id: str,
        text: str,
        finish_reason: FinishReason,
        usage: Usage,
        timings: Timings,
        tool_calls: list[AssistantToolCall] | None = None,
    ) -> list[ServerEvent]:
        """End a turn (see ``Session.on_done``); return the events to send.

        Raises:
            ValueError: ``turn_id`` is not running here (a caller bug).
        """
        session = self._owner(turn_id)
        if session is not None:
            events = session.on_done(turn_id, text, finish_reason, usage, timings, tool_calls)
            self.store.save(session)
        else:
            plan = self._stateless_plan(turn_id)
            self._stateless = None
            if finish_reason == "error":
                events = plan.failed(ErrorCode.INTERNAL, "the model failed while generating", usage, timings)
            else:
                events = [plan.done(text, finish_reason, usage, timings, tool_calls=tool_calls)]
        del self._turns[turn_id]
        return events

    def on_error(
        self, turn_id: str, code: ErrorCode, message: str, usage: Usage | None = None, timings: Timings | None = None
    ) -> list[ServerEvent]:
        """End a turn as failed (see ``Session.on_error``); return the ``error`` and ``reply.done`` to send.

        Raises:
            ValueError: ``turn_id`` is not running here (a caller bug).
        """
        session = self._owner(turn_id)
        if session is not None:
            events = session.on_error(turn_id, code, message, usage, timings)
            self.store.save(session)
        else:
            events = self._stateless_plan(turn_id).failed(code, message, usage, timings)
            self._stateless = None
        del self._turns[turn_id]
        return events

    def close(self) -> tuple[str, ...]:
        """The client went away: return the turn ids the engine must cancel.

        Keep feeding their results to ``on_done`` / ``on_error`` so that their sessions return to IDLE (a cancelled
        reply with some text is kept, see ``Session``); the events they return can be dropped.
        """
        return tuple(self._turns)

    # ---------------------------------------------------------------- internals

    def _dispatch(self, event: ClientEvent) -> Step:
        match event:
            case Ping():
                return Step(send=(Pong(reply_to=event.event_id),))
            case SessionCreate():
                model = self._model(event.model)
                self.session = self.store.create(model, event.system, event.sampling, owner=self.tenant)
                return Step(send=(SessionCreated(reply_to=event.event_id, session=self.session.info()),))
            case SessionResume():
                self.session = self.store.get(event.session_id, event.event_id, owner=self.tenant)
                return Step(send=(SessionResumed(reply_to=event.event_id, session=self.session.info()),))
            case CompletionCreate():
                return self._completion(event)
            case TurnCancel():
                return Step(cancel=self._cancel(event))
        session = self._bound(event.event_id)
        match event:
            case TurnCreate():
                return self._started(session, session.create_turn(event))
            case TurnRegenerate():
                return self._started(session, session.regenerate(event))
            case TurnEdit():
                return self._started(session, session.edit(event))
            case ToolResults():
                return self._started(session, session.tool_results(event))
            case SessionUpdate():
                step = Step(send=(session.update(event),))
                self.store.save(session)
                return step
            case ConversationGet():
                return Step(send=(session.conversation(event),))
        raise AssertionError(f"unhandled event {event.type}")  # pragma: no cover - every ClientEvent is matched

    def _model(self, name: str | None) -> str:
        if name is None:
            return self.models[0]
        if name not in self.models:
            raise ProtocolError(ErrorCode.UNKNOWN_MODEL, f"model {name!r} is not served here; try {self.models}")
        return name

    def _bound(self, event_id: str | None) -> Session:
        if self.session is None:
            raise ProtocolError(ErrorCode.NO_SESSION, "send session.create or session.resume first", event_id)
        return self.session

    def _started(self, session: Session, plan: TurnPlan) -> Step:
        self.store.save(session)
        self._turns[plan.turn_id] = session
        return Step(send=(plan.started(),), start=plan)

    def _completion(self, event: CompletionCreate) -> Step:
        if self._stateless is not None:
            message = f"turn {self._stateless.turn_id} is generating on this connection; cancel it or wait"
            raise ProtocolError(ErrorCode.BUSY, message, event.event_id)
        plan = plan_completion(event, self._model(event.model), self._new_id)
        self._stateless = plan
        self._turns[plan.turn_id] = None
        return Step(send=(plan.started(),), start=plan)

    def _cancel(self, event: TurnCancel) -> tuple[str, ...]:
        if event.turn_id in self._turns:  # started here: stateless, or a turn of any session
            owner = self._turns[event.turn_id]
            return (owner.cancel(event) if owner is not None else event.turn_id,)
        if event.turn_id is not None and self.session is not None:
            return (self.session.cancel(event),)  # a turn of the bound session started elsewhere, or not_generating
        turn_ids = [self._stateless.turn_id] if self._stateless else []
        if event.turn_id is None and self.session is not None and self.session.turn_id is not None:
            turn_ids.append(self.session.cancel(event))
        if not turn_ids:
            what = f"turn {event.turn_id!r} is" if event.turn_id else "nothing is"
            raise ProtocolError(ErrorCode.NOT_GENERATING, f"{what} in progress", event.event_id)
        return tuple(turn_ids)

    def _owner(self, turn_id: str) -> Session | None:
        if turn_id not in self._turns:
            raise ValueError(f"turn {turn_id!r} is not running on this connection")
        return self._turns[turn_id]

    def _stateless_plan(self, turn_id: str) -> TurnPlan:
        assert self._stateless is not None and self._stateless.turn_id == turn_id
        return self._stateless
