"""The session state machine: one conversation, its settings, and the turn in progress. Pure: no I/O, no clock.

States::

    IDLE --turn.create / turn.regenerate / turn.edit--> GENERATING --on_done / on_error--> IDLE
    IDLE, GENERATING --close()--> CLOSED  (a turn in progress can still be cancelled, and reports through
                                           on_done / on_error)

The conversation (``messages``) alternates user, assistant, user, assistant ... except that a reply with tool calls
may be followed by ``tool`` messages (the results of its calls, from ``tool.results``) and then the next reply. It is
only changed when a turn ends: a turn is planned on a *copy* (the history the reply will follow) and committed by
``on_done``. So a failed turn leaves the conversation exactly as it was (tool results included: send them again),
and ``conversation.get`` during a turn shows the old state.

What ``on_done`` commits:

- ``stop`` / ``length`` / ``tool_calls``: the history plus the reply (a ``length`` reply is kept, truncated; a
  ``tool_calls`` reply keeps its calls).
- ``cancelled``: the history plus the partial reply if it holds any non-blank text; otherwise nothing changes
  (a cancelled turn.create leaves no unanswered user message; a cancelled regenerate keeps the old reply).
- ``error`` (or ``on_error``): nothing changes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from chat.protocol.client_events import (
    CompletionCreate,
    ConversationGet,
    SessionUpdate,
    ToolResults,
    TurnCancel,
    TurnCreate,
    TurnEdit,
    TurnRegenerate,
)
from chat.protocol.content import ConversationMessage, FinishReason, PromptMessage, media_parts
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.ids import IdFactory, new_id
from chat.protocol.limits import MAX_MEDIA_PER_CONVERSATION, MAX_MESSAGES
from chat.protocol.sampling import SamplingSettings
from chat.protocol.server_events import (
    ZERO_USAGE,
    Conversation,
    ErrorEvent,
    ReplyDelta,
    ReplyDone,
    ReplyToolCall,
    ServerEvent,
    SessionInfo,
    SessionUpdated,
    Timings,
    TurnStarted,
    Usage,
)
from chat.protocol.tools import AssistantToolCall, ToolChoiceWire, ToolDef

TurnKind = Literal["create", "regenerate", "edit", "tool_results", "completion"]
TurnEvent = TurnCreate | TurnRegenerate | TurnEdit | ToolResults  # client events that start a session turn


class SessionState(enum.Enum):
    IDLE = "idle"  # no turn in progress; turns may start
    GENERATING = "generating"  # one turn in progress; a new turn is refused with `busy`
    CLOSED = "closed"  # evicted or shut down; client events other than turn.cancel get `unknown_session`


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """What the engine must generate next: a reply to ``messages`` with ``sampling`` on ``model``.

    The caller must send ``plan.started()`` first, then run the engine and report back through ``on_delta`` /
    ``on_done`` / ``on_error`` with ``plan.turn_id``.
    """

    turn_id: str  # names the turn in every later call and event
    kind: TurnKind  # which client event asked for it
    messages: tuple[PromptMessage, ...]  # system first, last is the user message being answered
    sampling: SamplingSettings  # a snapshot: session.update during the turn does not change it
    model: str  # the model that must answer
    session_id: str | None  # None in stateless mode
    user_message_id: str | None  # the id of the last message (None in stateless mode)
    reply_to: str | None  # the event_id of the client event that asked for the turn
    tools: tuple[ToolDef, ...] = ()  # functions the reply may call (checked by the transport before it starts)
    tool_choice: ToolChoiceWire | None = None  # as sent (None: the default)
    parallel_tool_calls: bool | None = None  # as sent (None: the default, true)

    def started(self) -> TurnStarted:
        """The ``turn.started`` event to send before the first delta."""
        return TurnStarted(
            reply_to=self.reply_to,
            turn_id=self.turn_id,
            session_id=self.session_id,
            kind=self.kind,
            user_message_id=self.user_message_id,
        )

    def delta(self, text: str, token_ids: list[int] | None = None, logprobs: list | None = None) -> ReplyDelta:
        """The ``reply.delta`` event for new text of this turn (``logprobs``: wire dicts, when asked for)."""
        return ReplyDelta(
            reply_to=self.reply_to, turn_id=self.turn_id, delta=text, token_ids=token_ids, logprobs=logprobs
        )

    def tool_call(self, index: int, call: AssistantToolCall) -> ReplyToolCall:
        """The ``reply.tool_call`` event for one call of this turn's reply."""
        return ReplyToolCall(reply_to=self.reply_to, turn_id=self.turn_id, index=index, call=call)

    def done(
        self,
        text: str,
        finish_reason: FinishReason,
        usage: Usage,
        timings: Timings,
        message_id: str | None = None,
        tool_calls: list[AssistantToolCall] | None = None,
    ) -> ReplyDone:
        """The ``reply.done`` event that ends this turn."""
        return ReplyDone(
            reply_to=self.reply_to,
            turn_id=self.turn_id,
            message_id=message_id,
            text=text,
            finish_reason=finish_reason,
            usage=usage,
            timings=timings,
            tool_calls=tool_calls or None,
        )

    def failed(self, code: ErrorCode, message: str, usage: Usage | None, timings: Timings | None) -> list[ServerEvent]:
        """The ``error`` + ``reply.done`` pair that ends this turn when it failed."""
        error = ErrorEvent(reply_to=self.reply_to, code=code, message=message, turn_id=self.turn_id)
        return [error, self.done("", "error", usage or ZERO_USAGE, timings or Timings())]


@dataclass(slots=True)
class _Turn:
    plan: TurnPlan  # what the engine was asked to do
    history: list[ConversationMessage]  # the conversation the reply follows; committed (+ reply) by on_done


class Session:
    """One conversation and its settings. Not thread-safe: one event loop (or lock) drives it."""

    def __init__(
        self,
        model: str,
        *,
        system: str | None = None,
        sampling: SamplingSettings | None = None,
        session_id: str | None = None,
        owner: str = "",
        new_id: IdFactory = new_id,
    ) -> None:
        self._new_id = new_id  # makes turn and message ids
        self.id = session_id or new_id("sess")  # what session.resume names
        self.owner = owner  # the tenant that created it: only that tenant can find it in a store
        self.model = model  # fixed for the session's life (it is part of every cached prefix's key)
        self.system = system  # the system prompt, rendered before the conversation
        self.sampling = sampling or SamplingSettings()  # settings for the next turn
        self.messages: list[ConversationMessage] = []  # committed conversation: user, assistant, user, ...
        self.state = SessionState.IDLE
        self._turn: _Turn | None = None  # the turn in progress
        self.interrupted_turn_id: str | None = None  # set by a persistent store for a turn cut off by a restart

    # ---------------------------------------------------------------- reading

    @property
    def turn_id(self) -> str | None:
        """The turn in progress, if any."""
        return self._turn.plan.turn_id if self._turn else None

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            model=self.model,
            system=self.system,
            sampling=self.sampling,
            messages=len(self.messages),
            state=self.state.value,
            interrupted_turn_id=self.interrupted_turn_id,
        )

    def conversation(self, event: ConversationGet | None = None) -> Conversation:
        """The ``conversation`` event answering ``event``: committed messages only (see the module docstring).

        Raises:
            ProtocolError: ``unknown_session`` when the session is closed.
        """
        reply_to = event.event_id if event else None
        self._require_open(reply_to)
        return Conversation(
            reply_to=reply_to, session_id=self.id, messages=list(self.messages), generating=self.turn_id
        )

    # ---------------------------------------------------------------- client events

    def create_turn(self, event: TurnCreate) -> TurnPlan:
        """Plan a reply to a new user message. The caller must start the plan (see :class:`TurnPlan`).

        Raises:
            ProtocolError: ``busy`` while a turn is in progress; ``context_overflow`` when the conversation would
                exceed MAX_MESSAGES or MAX_MEDIA_PER_CONVERSATION; ``unknown_session`` when closed.
        """
        self._require_idle(event.event_id)
        user = ConversationMessage(id=self._new_id("msg"), role="user", content=event.content)
        return self._begin("create", [*self.messages, user], event)

    def regenerate(self, event: TurnRegenerate) -> TurnPlan:
        """Plan a new answer to the last user message; the old reply is replaced when the new one is done.

        Raises:
            ProtocolError: ``busy``; ``invalid_event`` when there is no reply to regenerate; ``unknown_session``.
        """
        self._require_idle(event.event_id)
        if not self.messages:
            raise ProtocolError(ErrorCode.INVALID_EVENT, "there is no reply to regenerate", event.event_id)
        return self._begin("regenerate", self.messages[:-1], event)

    def edit(self, event: TurnEdit) -> TurnPlan:
        """Plan a reply to an edited user message; it and everything after it are replaced when the reply is done.

        The edited message gets a new id (it starts a new branch).

        Raises:
            ProtocolError: ``busy``; ``invalid_event`` when the index is out of range, the id is unknown, or the
                target is an assistant message; ``context_overflow``; ``unknown_session``.
        """
        self._require_idle(event.event_id)
        at = self._edit_target(event)
        user = ConversationMessage(id=self._new_id("msg"), role="user", content=event.content)
        return self._begin("edit", [*self.messages[:at], user], event)

    def tool_results(self, event: ToolResults) -> TurnPlan:
        """Plan the reply that follows the results of the last reply's tool calls; the results join the conversation
        with that reply, when it is done.

        Raises:
            ProtocolError: ``busy``; ``invalid_event`` naming ``results.<i>.tool_call_id`` when the last message is
                not a reply with tool calls, or a result names no call of it, or one already answered;
                ``context_overflow``; ``unknown_session``.
        """
        self._require_idle(event.event_id)
        last = self.messages[-1] if self.messages else None
        calls = {c.id for c in last.tool_calls or ()} if last is not None and last.role == "assistant" else set()
        results = []
        for i, result in enumerate(event.results):
            field = f"results.{i}.tool_call_id"
            if not calls:
                message = f"{field}: the last message is not a reply with tool calls; there is nothing to answer"
                raise ProtocolError(ErrorCode.INVALID_EVENT, message, event.event_id)
            if result.tool_call_id not in calls:
                message = f"{field}: {result.tool_call_id!r} answers no call of the last reply (or an answered one)"
                raise ProtocolError(ErrorCode.INVALID_EVENT, message, event.event_id)
            calls.discard(result.tool_call_id)
            results.append(
                ConversationMessage(
                    id=self._new_id("msg"), role="tool", content=result.content, tool_call_id=result.tool_call_id
                )
            )
        return self._begin("tool_results", [*self.messages, *results], event)

    def cancel(self, event: TurnCancel) -> str:
        """Accept a cancel request; return the turn id the caller must cancel in the engine.

        The session stays GENERATING until the engine's result arrives through ``on_done`` (finish_reason
        ``cancelled``). Cancelling twice returns the same id.

        A closed session still accepts it (its last turn may still be running).

        Raises:
            ProtocolError: ``not_generating`` when no turn (or not the named one) is in progress.
        """
        turn = self._turn
        if turn is None or (event.turn_id is not None and event.turn_id != turn.plan.turn_id):
            what = f"turn {event.turn_id!r} is" if event.turn_id else "no turn is"
            raise ProtocolError(ErrorCode.NOT_GENERATING, f"{what} in progress", event.event_id)
        return turn.plan.turn_id

    def update(self, event: SessionUpdate) -> SessionUpdated:
        """Apply new settings (the fields the client sent) to the next turns; a turn in progress keeps its own.

        Raises:
            ProtocolError: ``unknown_session`` when closed.
        """
        self._require_open(event.event_id)
        self.sampling = self.sampling.merged(event.sampling)
        if "system" in event.model_fields_set:
            self.system = event.system
        return SessionUpdated(reply_to=event.event_id, session=self.info())

    def close(self) -> str | None:
        """Refuse every later client event. Return the turn id the caller must cancel in the engine, if any.

        Results of that turn must still be fed to ``on_done`` / ``on_error``.
        """
        self.state = SessionState.CLOSED
        return self.turn_id

    # ---------------------------------------------------------------- engine results

    def on_delta(
        self, turn_id: str, text: str, token_ids: list[int] | None = None, logprobs: list | None = None
    ) -> ReplyDelta:
        """The ``reply.delta`` event to send for new reply text.

        Raises:
            ValueError: ``turn_id`` is not the turn in progress (a caller bug).
        """
        return self._current(turn_id).plan.delta(text, token_ids, logprobs)

    def on_tool_call(self, turn_id: str, index: int, call: AssistantToolCall) -> ReplyToolCall:
        """The ``reply.tool_call`` event to send for one call of the reply (before ``on_done``).

        Raises:
            ValueError: ``turn_id`` is not the turn in progress (a caller bug).
        """
        return self._current(turn_id).plan.tool_call(index, call)

    def on_done(
        self,
        turn_id: str,
        text: str,
        finish_reason: FinishReason,
        usage: Usage,
        timings: Timings,
        tool_calls: list[AssistantToolCall] | None = None,
    ) -> list[ServerEvent]:
        """End the turn: commit the reply (``text``: what it says besides its ``tool_calls``; see the module
        docstring); return the events to send.

        ``finish_reason`` ``error`` is handled as ``on_error`` with code ``internal``.

        Raises:
            ValueError: ``turn_id`` is not the turn in progress (a caller bug).
        """
        turn = self._current(turn_id)
        if finish_reason == "error":
            return self.on_error(turn_id, ErrorCode.INTERNAL, "the model failed while generating", usage, timings)
        self._end_turn()
        if finish_reason == "cancelled" and not text.strip() and not tool_calls:
            return [turn.plan.done(text, finish_reason, usage, timings)]
        reply = ConversationMessage(
            id=self._new_id("msg"),
            role="assistant",
            content=text,
            finish_reason=finish_reason,
            tool_calls=list(tool_calls) if tool_calls else None,
        )
        self.messages = [*turn.history, reply]
        return [turn.plan.done(text, finish_reason, usage, timings, message_id=reply.id, tool_calls=tool_calls)]

    def on_error(
        self, turn_id: str, code: ErrorCode, message: str, usage: Usage | None = None, timings: Timings | None = None
    ) -> list[ServerEvent]:
        """End the turn as failed (e.g. ``context_overflow``, ``invalid_media`` from decoding, ``internal``); the
        conversation is left unchanged. Return the ``error`` and ``reply.done`` events to send.

        Raises:
            ValueError: ``turn_id`` is not the turn in progress (a caller bug).
        """
        turn = self._current(turn_id)
        self._end_turn()
        return turn.plan.failed(code, message, usage, timings)

    # ---------------------------------------------------------------- checks (tests call this after every step)

    def check_invariants(self) -> None:
        """Assert the state machine's invariants."""
        check_order(self.messages)
        assert not self.messages or self.messages[-1].role == "assistant", "a conversation ends with a reply"
        assert len({m.id for m in self.messages}) == len(self.messages), "message ids are unique"
        assert (self.state is SessionState.GENERATING) == (self._turn is not None) or self.state is SessionState.CLOSED
        if self._turn is not None:
            assert self._turn.history and self._turn.history[-1].role in ("user", "tool")
            check_order(self._turn.history)

    # ---------------------------------------------------------------- internals

    def _require_open(self, event_id: str | None) -> None:
        if self.state is SessionState.CLOSED:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"session {self.id} is closed", event_id)

    def _require_idle(self, event_id: str | None) -> None:
        self._require_open(event_id)
        if self._turn is not None:
            message = (
                f"session {self.id} is generating turn {self._turn.plan.turn_id}; cancel it or wait for reply.done"
            )
            raise ProtocolError(ErrorCode.BUSY, message, event_id)

    def _edit_target(self, event: TurnEdit) -> int:
        if event.message_id is not None:
            at = next((i for i, m in enumerate(self.messages) if m.id == event.message_id), None)
            if at is None:
                raise ProtocolError(ErrorCode.INVALID_EVENT, f"no message has id {event.message_id!r}", event.event_id)
        else:
            at = event.index
            assert at is not None  # TurnEdit validates that one of the two is given
            if at >= len(self.messages):
                message = f"index: {at} is out of range (the conversation has {len(self.messages)} messages)"
                raise ProtocolError(ErrorCode.INVALID_EVENT, message, event.event_id)
        if self.messages[at].role != "user":
            raise ProtocolError(
                ErrorCode.INVALID_EVENT, f"message {at} is a reply; only user messages can be edited", event.event_id
            )
        return at

    def _begin(self, kind: TurnKind, history: list[ConversationMessage], event: TurnEvent) -> TurnPlan:
        event_id, sampling = event.event_id, event.sampling
        check_conversation_limits(
            len(history) + 1 + (self.system is not None), sum(len(media_parts(m.content)) for m in history), event_id
        )
        plan = TurnPlan(
            turn_id=self._new_id("turn"),
            kind=kind,
            messages=render(self.system, history),
            sampling=self.sampling.merged(sampling) if sampling is not None else self.sampling,
            model=self.model,
            session_id=self.id,
            user_message_id=history[-1].id,
            reply_to=event_id,
            tools=tuple(event.tools or ()),
            tool_choice=event.tool_choice,
            parallel_tool_calls=event.parallel_tool_calls,
        )
        self._turn = _Turn(plan, history)
        self.state = SessionState.GENERATING
        self.interrupted_turn_id = None
        return plan

    def _current(self, turn_id: str) -> _Turn:
        if self._turn is None or self._turn.plan.turn_id != turn_id:
            raise ValueError(f"turn {turn_id!r} is not in progress in session {self.id}")
        return self._turn

    def _end_turn(self) -> None:
        self._turn = None
        if self.state is SessionState.GENERATING:
            self.state = SessionState.IDLE


def render(system: str | None, history: list[ConversationMessage]) -> tuple[PromptMessage, ...]:
    """The prompt's messages: the system prompt (if any), then the history, as stored (media keep their digests)."""
    head = (PromptMessage("system", system),) if system is not None else ()
    return head + tuple(PromptMessage(m.role, m.content, tuple(m.tool_calls or ()), m.tool_call_id) for m in history)


def check_order(messages: list[ConversationMessage]) -> None:
    """Assert the conversation's order: it starts with a user message; a reply follows a user message or tool
    results; a tool result follows a reply with calls (or another result) and answers one of that reply's calls."""
    calls: set[str] = set()  # the calls of the last reply, not yet answered
    previous = None
    for m in messages:
        if m.role == "user":
            assert previous in (None, "assistant"), [x.role for x in messages]
        elif m.role == "assistant":
            assert previous in ("user", "tool"), [x.role for x in messages]
            calls = {c.id for c in m.tool_calls or ()}
        else:
            assert previous in ("assistant", "tool") and m.tool_call_id in calls, [x.role for x in messages]
            calls.discard(m.tool_call_id)
        previous = m.role


def check_conversation_limits(messages: int, media: int, event_id: str | None) -> None:
    """Refuse a conversation of ``messages`` messages (reply and system prompt included) holding ``media`` items.

    Raises:
        ProtocolError: ``context_overflow`` beyond MAX_MESSAGES or MAX_MEDIA_PER_CONVERSATION.
    """
    if messages > MAX_MESSAGES:
        raise ProtocolError(
            ErrorCode.CONTEXT_OVERFLOW,
            f"a conversation holds at most {MAX_MESSAGES} messages; edit an earlier message or start a new session",
            event_id,
        )
    if media > MAX_MEDIA_PER_CONVERSATION:
        raise ProtocolError(
            ErrorCode.CONTEXT_OVERFLOW,
            f"a conversation holds at most {MAX_MEDIA_PER_CONVERSATION} "
            "media items; edit an earlier message or start a new session",
            event_id,
        )


def plan_completion(event: CompletionCreate, model: str, new_id: IdFactory = new_id) -> TurnPlan:
    """Plan a stateless turn (``completion.create``): the event's messages as they are, nothing stored.

    The caller must track that the turn is running (for ``busy`` and ``turn.cancel``) and build its events with
    ``plan.delta`` / ``plan.done`` / ``plan.failed``.
    """
    messages = tuple(m.prompt() for m in event.messages)
    return TurnPlan(
        turn_id=new_id("turn"),
        kind="completion",
        messages=messages,
        sampling=event.sampling,
        model=model,
        session_id=None,
        user_message_id=None,
        reply_to=event.event_id,
        tools=tuple(event.tools or ()),
        tool_choice=event.tool_choice,
        parallel_tool_calls=event.parallel_tool_calls,
    )
