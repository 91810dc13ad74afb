"""Events a client sends, one model per event, tagged by ``type``; :data:`ClientEvent` is their union.

Every client event may carry ``event_id``, a string the client chooses; every server event that answers it
(including an ``error``) echoes it as ``reply_to``. Parse frames with ``parse_client_event``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from chat.protocol.base import WireModel
from chat.protocol.content import ChatMessage, UserContent, check_media_count, check_tool_messages
from chat.protocol.limits import (
    MAX_EVENT_ID_CHARS,
    MAX_ID_CHARS,
    MAX_MESSAGES,
    MAX_MODEL_CHARS,
    MAX_TEXT_CHARS,
)
from chat.protocol.sampling import SamplingSettings
from chat.protocol.tools import MAX_TOOL_CALLS, MAX_TOOLS, ToolChoiceWire, ToolDef

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
EventId = Annotated[str, Field(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
ModelName = Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
SystemPrompt = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class _ClientEvent(WireModel):
    event_id: EventId | None = None  # chosen by the client; echoed as `reply_to` by the events that answer this one


class _OffersTools(WireModel):
    """The tools a turn may call, as in OpenAI's chat completions (``chat.protocol.tools``): for this turn only (send
    them again with each turn that may call them). The server checks them before the turn starts: a schema that is not
    JSON Schema is ``invalid_grammar``, a ``tool_choice`` naming no function or given without tools ``invalid_event``,
    each naming the field."""

    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceWire | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: bool | None = None  # None: true (several calls in one reply)


class SessionCreate(_ClientEvent):
    """Start a new session on this connection. Answered by ``session.created``."""

    type: Literal["session.create"] = "session.create"
    model: ModelName | None = None  # None: the server's default model
    system: SystemPrompt | None = None  # the system prompt, rendered before the conversation
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)


class SessionResume(_ClientEvent):
    """Attach an existing session (e.g. after a reconnect). Answered by ``session.resumed``."""

    type: Literal["session.resume"] = "session.resume"
    session_id: Id


class SessionUpdate(_ClientEvent):
    """Change the session's settings for the next turns. Only the fields sent change. Answered by ``session.updated``.

    ``system: null`` removes the system prompt; leaving ``system`` out keeps it.
    """

    type: Literal["session.update"] = "session.update"
    system: SystemPrompt | None = None
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)


class TurnCreate(_ClientEvent, _OffersTools):
    """Append a user message and generate a reply. Answered by ``turn.started``, ``reply.delta``*, ``reply.done``."""

    type: Literal["turn.create"] = "turn.create"
    content: UserContent
    sampling: SamplingSettings | None = None  # for this turn only, over the session's settings


class TurnCancel(_ClientEvent):
    """Stop the reply being generated. Answered by its ``reply.done`` with ``finish_reason: "cancelled"``."""

    type: Literal["turn.cancel"] = "turn.cancel"
    turn_id: Id | None = None  # None: whatever this connection is generating


class TurnRegenerate(_ClientEvent, _OffersTools):
    """Drop the last reply and generate it again from the same prompt. Answered like ``turn.create``."""

    type: Literal["turn.regenerate"] = "turn.regenerate"
    sampling: SamplingSettings | None = None  # for this turn only, over the session's settings


class TurnEdit(_ClientEvent, _OffersTools):
    """Replace an earlier user message and generate from there; every later message is dropped (a new branch).

    Name the message by ``index`` (0-based position in the ``conversation`` event's ``messages``) or by
    ``message_id``, not both. Answered like ``turn.create``.
    """

    type: Literal["turn.edit"] = "turn.edit"
    index: Annotated[int, Field(ge=0)] | None = None
    message_id: Id | None = None
    content: UserContent
    sampling: SamplingSettings | None = None  # for this turn only, over the session's settings

    @model_validator(mode="after")
    def _exactly_one_target(self) -> TurnEdit:
        if (self.index is None) == (self.message_id is None):
            raise PydanticCustomError("edit_target", "give exactly one of index and message_id")
        return self


class ToolResult(WireModel):
    """What one call of the last reply returned."""

    tool_call_id: Id  # the `id` of a call in the last reply's `tool_calls`
    content: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]  # the result, as text (often JSON)


class ToolResults(_ClientEvent, _OffersTools):
    """Answer the last reply's tool calls and generate the reply that follows the results. The results (one ``tool``
    message each, in the order given) join the conversation together with that reply, when it is done.

    Refused (``invalid_event``, naming ``results.<i>.tool_call_id``) when the last message is not a reply with tool
    calls, or a result names no call of it or the same call twice. Answered like ``turn.create``."""

    type: Literal["tool.results"] = "tool.results"
    results: Annotated[list[ToolResult], Field(min_length=1, max_length=MAX_TOOL_CALLS)]
    sampling: SamplingSettings | None = None  # for this turn only, over the session's settings


class ConversationGet(_ClientEvent):
    """Ask for the session's conversation. Answered by ``conversation``."""

    type: Literal["conversation.get"] = "conversation.get"


class CompletionCreate(_ClientEvent, _OffersTools):
    """Stateless mode: the whole message list in, one reply out; no session needed, nothing is kept.

    Rules: a ``system`` message may only come first; the last message is a ``user`` message or a ``tool`` result;
    a ``tool`` message answers a call (``tool_call_id``) of an earlier assistant message's ``tool_calls``. The
    tools the reply may call come with the event, as in ``turn.create``. Answered by ``turn.started``
    (``session_id`` null), ``reply.delta``*, ``reply.tool_call``* and ``reply.done``.
    """

    type: Literal["completion.create"] = "completion.create"
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    model: ModelName | None = None
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)

    @model_validator(mode="after")
    def _well_formed(self) -> CompletionCreate:
        if any(m.role == "system" for m in self.messages[1:]):
            raise PydanticCustomError("message_order", "a system message may only come first")
        if self.messages[-1].role not in ("user", "tool"):
            raise PydanticCustomError("message_order", "the last message must be a user message or a tool result")
        check_tool_messages(self.messages)
        check_media_count(self.messages)
        return self


class Ping(_ClientEvent):
    """Liveness check. Answered by ``pong``."""

    type: Literal["ping"] = "ping"


ClientEvent = Annotated[
    SessionCreate
    | SessionResume
    | SessionUpdate
    | TurnCreate
    | TurnCancel
    | TurnRegenerate
    | TurnEdit
    | ToolResults
    | ConversationGet
    | CompletionCreate
    | Ping,
    Field(discriminator="type"),
]
"""Any client event; ``type`` selects the model."""

CLIENT_EVENT_TYPES: tuple[str, ...] = (
    "session.create",
    "session.resume",
    "session.update",
    "turn.create",
    "turn.cancel",
    "turn.regenerate",
    "turn.edit",
    "tool.results",
    "conversation.get",
    "completion.create",
    "ping",
)
