"""OpenAI's chat completion on the wire (``POST /v1/chat/completions``): the reply (:class:`ChatCompletion`), the
stream's chunks (:class:`ChatCompletionChunk`, its deltas tagged by what they carry), usage and timings, as
openai-python's ``types/chat`` lays them out.

They are slotted dataclasses, written by orjson, which encodes a dataclass natively (in C, its fields in order): a
stream's chunk costs what the dict literal it replaces cost (pydantic's ``model_dump`` cost several times more per
chunk; msgspec would need a new dependency for no gain here). A field listed in a class's ``OMIT_NONE`` is left out
of the JSON while None, as OpenAI leaves it out (``reasoning_content``, ``tool_calls``, a usage's cache miss fields);
such classes are written by :func:`encode` (orjson's ``default`` hook, once per reply or final chunk), never per
token. The bytes are pinned by ``tests/chat/server/test_wire_bodies.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import Any, ClassVar, Literal

import orjson

from chat.engine.events import Done

Wire = dataclass(slots=True, kw_only=True)  # every wire model: slotted, fields by name
Hot = dataclass(slots=True)  # one made per streamed token: made positionally (a little cheaper)


def encode(obj: Any) -> bytes:
    """``obj`` as JSON, leaving out the None fields its classes list in ``OMIT_NONE``."""
    return orjson.dumps(obj, default=_as_dict, option=orjson.OPT_PASSTHROUGH_DATACLASS)


@cache
def _names(cls: type) -> tuple[tuple[str, bool], ...]:
    omit = getattr(cls, "OMIT_NONE", ())
    return tuple((f.name, f.name in omit) for f in fields(cls))


def _as_dict(obj: Any) -> dict[str, Any]:
    if not hasattr(obj, "__dataclass_fields__"):
        raise TypeError(f"{type(obj).__name__} is not a wire model")
    out = {}
    for name, omit in _names(type(obj)):
        value = getattr(obj, name)
        if value is not None or not omit:
            out[name] = value
    return out


# --- usage -----------------------------------------------------------------------------------------------------


@Wire
class PromptTokensDetails:
    cached_tokens: int  # prompt tokens served from the prefix cache
    cache_miss_reason: str | None = None  # why reuse stopped before the prompt's end (docs/openai.md)
    cache_miss_at: int | None = None  # the prompt position it names

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("cache_miss_reason", "cache_miss_at")


@Wire
class CompletionUsage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


@Wire
class Timings:
    """Our extra ``timings`` object (``chat.server.reply.turns.wire_timings``)."""

    ttft_ms: float | None = None  # left out when no token was generated
    decode_tokens_per_s: float = 0.0
    total_ms: float = 0.0
    prefill_ms: float | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("ttft_ms", "prefill_ms")


def usage_of(dones: list[Done]) -> tuple[CompletionUsage, Timings]:
    """A request's usage (the prompt counted once, every reply's tokens) and the first reply's timings."""
    from chat.server.reply.turns import wire_timings, wire_usage

    first = wire_usage(dones[0])
    details = first.prompt_tokens_details
    completion = sum(d.usage.completion_tokens for d in dones)
    usage = CompletionUsage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=completion,
        total_tokens=first.prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=details.cached_tokens,
            cache_miss_reason=details.cache_miss_reason,
            cache_miss_at=details.cache_miss_at,
        ),
    )
    t = wire_timings(dones[0])
    return usage, Timings(
        ttft_ms=t.ttft_ms, decode_tokens_per_s=t.decode_tokens_per_s, total_ms=t.total_ms, prefill_ms=t.prefill_ms
    )


# --- log-probabilities and tool calls --------------------------------------------------------------------------


@Hot
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int]


@Hot
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


@Wire
class ChoiceLogprobs:
    content: list[TokenLogprob]
    refusal: None = None


@Hot
class ChunkLogprobs:
    """A stream chunk's log-probabilities (no ``refusal``)."""

    content: list[TokenLogprob]


@Wire
class Function:
    name: str
    arguments: str  # JSON text


@Wire
class ToolCall:
    id: str
    type: Literal["function"] = "function"
    function: Function


@Wire
class ToolCallDelta:
    """A call in a stream chunk: whole, with its index among the reply's calls."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: Function


# --- the whole reply -------------------------------------------------------------------------------------------


@Wire
class ChatCompletionMessage:
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    reasoning_content: str | None = None  # the thinking, when the model thought
    tool_calls: list[ToolCall] | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("reasoning_content", "tool_calls")


@Wire
class Choice:
    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"]


@Wire
class ChatCompletion:
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    timings: Timings


# --- the stream ------------------------------------------------------------------------------------------------


@Wire
class RoleDelta:
    """Each choice's first chunk."""

    role: Literal["assistant"] = "assistant"
    content: str = ""


@Hot
class ContentDelta:
    content: str


@Hot
class ReasoningDelta:
    reasoning_content: str


@Wire
class ToolCallsDelta:
    tool_calls: list[ToolCallDelta]


@Wire
class EmptyDelta:
    """A choice's last chunk (its finish reason)."""


Delta = RoleDelta | ContentDelta | ReasoningDelta | ToolCallsDelta | EmptyDelta


@Wire
class ChunkChoice:
    index: int
    delta: Delta
    logprobs: ChunkLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


@Wire
class ChatCompletionChunk:
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]


@Wire
class FinalChunk(ChatCompletionChunk):
    """The stream's last chunk: the request's usage and the first reply's timings (whether or not
    ``stream_options.include_usage`` was asked for)."""

    usage: CompletionUsage
    timings: Timings


@Wire
class StreamErrorBody:
    message: str
    type: str
    code: str | None = None

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("code",)


@Wire
class StreamError:
    """A stream that failed after it began: ``data: {"error": ...}`` then ``[DONE]``."""

    error: StreamErrorBody
