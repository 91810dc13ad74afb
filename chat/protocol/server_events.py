"""Events the server sends, one model per event, tagged by ``type``; :data:`ServerEvent` is their union.

``reply_to`` is the ``event_id`` of the client event being answered (absent when the client sent none). Every
``turn.started`` is followed by zero or more ``reply.delta`` and exactly one ``reply.done`` with the same
``turn_id`` (a failed turn also gets an ``error`` just before its ``reply.done``). A reply that calls tools sends one
``reply.tool_call`` per call just before its ``reply.done`` (``finish_reason: "tool_calls"``).
Send them with ``serialize_server_event``; clients read them with ``parse_server_event``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from chat.protocol.base import WireModel
from chat.protocol.content import ConversationMessage, FinishReason
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.sampling import SamplingSettings
from chat.protocol.tools import AssistantToolCall

NonNegative = Annotated[int, Field(ge=0)]
Millis = Annotated[float, Field(ge=0.0)]


class SessionInfo(WireModel):
    """A session's identity and settings."""

    id: str  # "sess_..."; whoever knows it can resume the session
    model: str  # the model that answers
    system: str | None = None  # the system prompt
    sampling: SamplingSettings  # settings for the next turn
    messages: NonNegative  # messages in the conversation (user and assistant; the system prompt not counted)
    state: Literal["idle", "generating", "closed"]
    interrupted_turn_id: str | None = None  # a turn that was still generating when the server stopped; it did not
    # finish and changed nothing. Reported until the session's next turn starts.


class PromptTokensDetails(WireModel):
    cached_tokens: NonNegative  # prompt tokens served from the prefix cache (not computed again)
    cache_miss_reason: str | None = None  # why reuse stopped before the prompt's last token (chat.engine.turn)
    cache_miss_at: NonNegative | None = None  # the prompt position the reason names


class Usage(WireModel):
    """Token counts of one turn, as in the OpenAI API."""

    prompt_tokens: NonNegative  # tokens in the rendered prompt
    completion_tokens: NonNegative  # tokens generated
    total_tokens: NonNegative  # prompt_tokens + completion_tokens
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(
        cls,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        miss_reason: str | None = None,
        miss_at: int | None = None,
    ) -> Usage:
        details = PromptTokensDetails(cached_tokens=cached_tokens, cache_miss_reason=miss_reason, cache_miss_at=miss_at)
        total = prompt_tokens + completion_tokens
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=total,
            prompt_tokens_details=details,
        )

    @model_validator(mode="after")
    def _consistent(self) -> Usage:
        if self.total_tokens != self.prompt_tokens + self.completion_tokens:
            raise PydanticCustomError("usage", "total_tokens must equal prompt_tokens + completion_tokens")
        if self.prompt_tokens_details.cached_tokens > self.prompt_tokens:
            raise PydanticCustomError("usage", "cached_tokens cannot exceed prompt_tokens")
        return self


ZERO_USAGE = Usage.of(0, 0)


class Timings(WireModel):
    """Where the time of one turn went."""

    ttft_ms: Millis | None = None  # turn start -> first token; None when no token was generated
    decode_tokens_per_s: Annotated[float, Field(ge=0.0)] = 0.0  # tokens after the first / time after the first
    total_ms: Millis = 0.0  # turn start -> done
    prefill_ms: Millis | None = None  # time spent computing the uncached part of the prompt


class _ServerEvent(WireModel):
    reply_to: str | None = None  # the event_id of the client event this answers


class SessionCreated(_ServerEvent):
    type: Literal["session.created"] = "session.created"
    session: SessionInfo


class SessionResumed(_ServerEvent):
    type: Literal["session.resumed"] = "session.resumed"
    session: SessionInfo


class SessionUpdated(_ServerEvent):
    type: Literal["session.updated"] = "session.updated"
    session: SessionInfo


class TurnStarted(_ServerEvent):
    """A reply is being generated. Deltas follow; ``turn_id`` names the turn in them and in ``turn.cancel``."""

    type: Literal["turn.started"] = "turn.started"
    turn_id: str  # "turn_..."
    session_id: str | None = None  # None in stateless mode (completion.create)
    kind: Literal["create", "regenerate", "edit", "tool_results", "completion"]  # which client event started it
    user_message_id: str | None = None  # the id of the user message being answered (None in stateless mode)


class TopLogprob(WireModel):
    """One likely token at a position (OpenAI's ``top_logprobs`` entry)."""

    token: str  # its text (bytes of a character cut in two show as U+FFFD)
    logprob: float  # natural log; -9999.0 stands for -infinity
    bytes: list[int]  # its bytes


class TokenLogprob(TopLogprob):
    """A generated token's log-probability under the model (OpenAI's ``logprobs.content`` entry)."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)  # the likeliest tokens there, most likely first


class ReplyDelta(_ServerEvent):
    type: Literal["reply.delta"] = "reply.delta"
    turn_id: str
    delta: str  # new text; concatenated deltas equal reply.done's text
    token_ids: list[int] | None = None  # the tokens this delta covers, when the server reports them
    logprobs: list[TokenLogprob] | None = None  # of those tokens, when the turn asked for `logprobs`


class ReplyToolCall(_ServerEvent):
    """One call of a reply that calls tools, whole (a reply that may call tools is read back once it is done, so its
    text comes as one ``reply.delta`` and its calls as these, in order, before ``reply.done``)."""

    type: Literal["reply.tool_call"] = "reply.tool_call"
    turn_id: str
    index: NonNegative  # its place among the reply's calls
    call: AssistantToolCall  # answer it with tool.results naming call.id


class ReplyDone(_ServerEvent):
    """The turn ended. If ``message_id`` is set the reply is now the conversation's last message."""

    type: Literal["reply.done"] = "reply.done"
    turn_id: str
    message_id: str | None = None  # the stored assistant message; None when nothing was stored
    text: str  # the whole reply (partial when cancelled); with tool calls, the text besides them
    finish_reason: FinishReason  # "tool_calls" when the reply called tools
    tool_calls: list[AssistantToolCall] | None = None  # the reply's calls (also sent as reply.tool_call events)
    usage: Usage
    timings: Timings


class Conversation(_ServerEvent):
    """A session's conversation: user and assistant messages, alternating, oldest first (the system prompt is in
    the session's settings). A turn in progress is not in it until its ``reply.done``."""

    type: Literal["conversation"] = "conversation"
    session_id: str
    messages: list[ConversationMessage]
    generating: str | None = None  # the turn id in progress, if any


class ErrorEvent(_ServerEvent):
    """A client event was refused, or a turn failed (then ``turn_id`` is set and ``reply.done`` follows)."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    turn_id: str | None = None

    @classmethod
    def of(cls, exc: ProtocolError, turn_id: str | None = None) -> ErrorEvent:
        """The event that reports ``exc`` to the client."""
        return cls(reply_to=exc.event_id, code=exc.code, message=exc.message, turn_id=turn_id)


class Pong(_ServerEvent):
    type: Literal["pong"] = "pong"


ServerEvent = Annotated[
    SessionCreated
    | SessionResumed
    | SessionUpdated
    | TurnStarted
    | ReplyDelta
    | ReplyToolCall
    | ReplyDone
    | Conversation
    | ErrorEvent
    | Pong,
    Field(discriminator="type"),
]
"""Any server event; ``type`` selects the model."""

SERVER_EVENT_TYPES: tuple[str, ...] = (
    "session.created",
    "session.resumed",
    "session.updated",
    "turn.started",
    "reply.delta",
    "reply.tool_call",
    "reply.done",
    "conversation",
    "error",
    "pong",
)
