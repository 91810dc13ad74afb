"""OpenAI-compatible HTTP: ``POST /v1/chat/completions`` (streaming SSE or not) and ``GET /v1/models``.

Every response carries ``usage.prompt_tokens_details.cached_tokens``: in a non-streaming response, and in the last
chunk of a stream (whether or not ``stream_options.include_usage`` was asked for; clients ignore what they do not
know). Each request is stateless: the client sends the whole conversation, and the prefix cache finds what it has.

**Nothing is silently ignored.** Every field of OpenAI's request is honoured or refused: a field no API of ours
knows gets OpenAI's own refusal (400, "Unrecognized request argument supplied: NAME", code ``unknown_parameter``);
an OpenAI field this server does not honour (tools, audio, ...) gets 400 ``unsupported_parameter`` naming it,
unless it is absent, null or its neutral value (``store: false``, ``modalities: ["text"]``, ``service_tier: "auto"``
or ``"default"``, ``parallel_tool_calls`` without tools, empty ``tools`` / ``metadata``). The table of fields is
``docs/openai.md``.

Messages use the WebSocket protocol's content types and limits (``chat.protocol.content``, ``chat.protocol.limits``)
in an OpenAI envelope (:class:`HttpMessage`); sampling fields (penalties, ``logit_bias``, ``logprobs``,
``response_format``, the ``structured_outputs`` extension, ...) are validated once, by the protocol's
``SamplingSettings``; usage and timings are converted by ``chat.server.reply.turns``, errors reported by
``chat.server.errors`` — the same as on the WebSocket. A grammar is compiled (or found compiled) before anything is
computed, so a bad schema is a 400 naming its field. ``n`` replies run as ``n`` turns (``chat.server.reply.choices``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, ClassVar, Literal

import orjson
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from chat.engine.events import Done, TurnRequest
from chat.engine.reasoning import Markers
from chat.protocol.client_events import ModelName
from chat.protocol.content import ChatMessage, Content, check_media_count
from chat.protocol.errors import ErrorCode
from chat.protocol.limits import MAX_MESSAGES
from chat.protocol.sampling import SamplingSettings
from chat.protocol.tools import MAX_TOOLS, ToolChoiceWire, ToolDef
from chat.server.errors import RequestError
from chat.server.reply import reasoning_api, tools_api
from chat.server.reply.choices import chat_logprobs, with_seeds
from chat.server.reply.reader import (
    CallsOut,
    Failed,
    Finished,
    Prepared,
    ReasoningOut,
    TextOut,
    open_replies,
    whole_replies,
)
from chat.server.reply.tools_api import ToolPlan
from chat.server.reply.turns import turn_request
from chat.server.surfaces import openai_types as wire

SAMPLING_FIELDS = (  # the request fields that are SamplingSettings' (same names)
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "structured_outputs",
    "priority",  # scheduling (vLLM's field), validated with the sampling fields
)
SHAPE_FIELDS = ("response_format", "structured_outputs")  # a malformed one is invalid_request, not a range error


def _neutral(name: str, value: Any, given: dict[str, Any]) -> bool:
    """Whether an OpenAI field we do not honour carries a value that asks for nothing."""
    if value is None or value is False or value == [] or value == {}:
        return True
    if name == "modalities":
        return value == ["text"]
    if name == "service_tier":
        return value in ("auto", "default")
    if name == "parallel_tool_calls":
        return not given.get("tools")
    return False


def refuse_unsupported(model: BaseModel, names: Sequence[str], where: str = "") -> None:
    """Raises RequestError ``unsupported_parameter`` for the first of ``names`` that ``model`` carries with a value
    that is not neutral."""
    given = {n: getattr(model, n) for n in names}
    for name, value in given.items():
        if not _neutral(name, value, given):
            raise RequestError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"{where}{name} is not supported by this server (see docs/openai.md)",
                param=f"{where}{name}",
            )


def sampling_of(body: BaseModel, max_tokens: int | None) -> SamplingSettings:
    """The request's sampling settings (fields left out or null take the model's defaults).

    Raises:
        RequestError: ``invalid_sampling`` naming the field out of range (``invalid_request`` for a malformed
            ``response_format`` / ``structured_outputs``).
    """
    values = {name: getattr(body, name) for name in SAMPLING_FIELDS if getattr(body, name, None) is not None}
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    try:
        return SamplingSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else str(first["type"])
        if field not in values and first["type"] in SAMPLING_FIELDS:
            field = str(first["type"])  # a rule across fields names its field as the error type
        code = ErrorCode.INVALID_REQUEST if field in SHAPE_FIELDS else ErrorCode.INVALID_SAMPLING
        raise RequestError(code, f"{field}: {first['msg']}", param=field) from None


def grammar_field(body: BaseModel) -> str:
    """The request field a turn's grammar comes from (named when it does not compile)."""
    if getattr(body, "tools", None) and getattr(body, "tool_choice", None) != "none":
        return "tools"
    return "structured_outputs" if getattr(body, "structured_outputs", None) is not None else "response_format"


class HttpMessage(ChatMessage):
    """One message of a request: the protocol's content types and rules (``ChatMessage``), with OpenAI's extras:
    the ``developer`` role (taken as ``system``), ``content: null``, an assistant's ``tool_calls`` and a ``tool``
    message's ``tool_call_id`` (``chat.server.reply.tools_api``); OpenAI's other message fields are refused unless
    null or empty."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # type: ignore[assignment]
    content: Content | None = None  # type: ignore[assignment]
    name: Any = None
    function_call: Any = None
    refusal: Any = None
    audio: Any = None
    annotations: Any = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = ("name", "function_call", "refusal", "audio")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False  # usage is in the last chunk either way
    include_obfuscation: bool | None = None  # OpenAI pads chunks against side channels; nothing to pad here


class ChatCompletionRequest(BaseModel):
    """The body of ``POST /v1/chat/completions``. Sampling fields are taken as sent and validated once, by
    :func:`sampling_of` (the protocol's ``SamplingSettings``)."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    messages: list[HttpMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension: not in the OpenAI API
    min_p: float | None = None  # extension
    repetition_penalty: float | None = None  # extension
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None  # extension (vLLM's name): json, regex, grammar, choice
    priority: int | None = None  # extension (vLLM's): lower is served sooner; None: the tenant's default
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    chat_template_kwargs: dict[str, Any] | None = None  # extension (vLLM's): variables for the chat template
    thinking_budget: Annotated[int, Field(ge=1)] | None = None  # extension: most thinking tokens
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceWire | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's fields this server does not honour: refused unless neutral (see the module docstring)
    audio: Any = None
    function_call: Any = None
    functions: Any = None
    metadata: Any = None
    modalities: Any = None
    prediction: Any = None
    prompt_cache_key: Any = None
    reasoning_effort: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    store: Any = None
    user: Any = None
    verbosity: Any = None
    web_search_options: Any = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = (
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "reasoning_effort",
        "verbosity",
        "web_search_options",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "user",
    )

    @model_validator(mode="after")
    def _media_count(self) -> ChatCompletionRequest:
        check_media_count(self.messages)
        return self

    def check(self, max_n: int) -> None:
        """Refuse what this server does not honour.

        Raises:
            RequestError: ``unsupported_parameter`` naming the field; ``invalid_sampling`` for ``n`` out of range.
        """
        refuse_unsupported(self, self.UNSUPPORTED)
        for i, message in enumerate(self.messages):
            if message.role == "function":
                raise RequestError(
                    ErrorCode.UNSUPPORTED_PARAMETER,
                    f"messages.{i}.role: function messages (the deprecated functions API) are not supported; "
                    "use tools and tool messages",
                    param=f"messages.{i}.role",
                )
            refuse_unsupported(message, HttpMessage.UNSUPPORTED, where=f"messages.{i}.")
        fmt = self.response_format or {}
        if self.tools and self.tool_choice != "none" and fmt.get("type") not in (None, "text"):
            message = "response_format with tools is not supported yet: constrain the tools' schemas instead"
            raise RequestError(ErrorCode.UNSUPPORTED_PARAMETER, message, param="response_format")
        if not 1 <= (self.n or 1) <= max_n:
            raise RequestError(ErrorCode.INVALID_SAMPLING, f"n: must be in [1, {max_n}]", param="n")

    def sampling(self) -> SamplingSettings:
        """Raises RequestError (see :func:`sampling_of`)."""
        given = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return sampling_of(self, given)


def build_turn(
    req: ChatCompletionRequest, salt: str, runtime, reply_cap: int | None = None
) -> tuple[TurnRequest, ToolPlan, Markers | None]:
    """The engine's request, with the request's tools rendered in the model's call format and its thinking set up;
    the tool plan and the thinking markers read the reply back.

    Raises:
        UnsupportedMediaError, RequestError, SamplingFieldError.
    """
    plan = tools_api.plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, runtime)
    fields = tools_api.history_calls(req.messages)
    messages = [m.prompt() for m in req.messages]
    turn = turn_request(messages, req.sampling(), salt=salt, runtime=runtime, reply_cap=reply_cap)
    turn = tools_api.apply(plan, turn, fields)
    turn = reasoning_api.apply(turn, runtime, req.chat_template_kwargs, req.thinking_budget)
    return turn, plan, reasoning_api.thinking_markers(runtime, req.chat_template_kwargs)


def prepare(body: ChatCompletionRequest, salt: str, runtime, reply_cap: int | None = None) -> Prepared:
    """The request as the pipeline runs it: ``n`` turns (seeded ``seed + i``), its tools and thinking markers.

    Raises:
        UnsupportedMediaError, RequestError, SamplingFieldError.
    """
    turn, plan, markers = build_turn(body, salt, runtime, reply_cap=reply_cap)
    return Prepared(with_seeds(turn, body.n or 1), plan, markers, grammar_field(body))


def usage_and_timings(dones: Sequence[Done]) -> dict:
    """The request's usage (the prompt counted once, every reply's tokens) and the first reply's timings, as dicts
    (the legacy completions surface adds them up)."""
    usage, timings = wire.usage_of(list(dones))
    return orjson.loads(wire.encode({"usage": usage, "timings": timings}))


def _finish(finished: Finished) -> str:
    """OpenAI's finish reason (a cancelled reply, which no client reads, as ``stop``)."""
    return "stop" if finished.finish == "cancelled" else finished.finish


def _logprobs(runtime, logprobs) -> list[wire.TokenLogprob]:
    return chat_logprobs(runtime, logprobs, wire.TokenLogprob, wire.TopLogprob)


def _calls(calls) -> list[wire.ToolCall]:
    return [wire.ToolCall(id=c["id"], function=wire.Function(**c["function"])) for c in tools_api.wire_calls(calls)]


def _message(finished: Finished) -> wire.ChatCompletionMessage:
    """The assistant message of a finished reply (its thinking apart, its calls read back)."""
    return wire.ChatCompletionMessage(
        content=finished.content,
        reasoning_content=finished.reasoning,
        tool_calls=_calls(finished.calls) if finished.calls else None,
    )


async def complete(
    engine, turns: Sequence[TurnRequest], model: str, plan: ToolPlan | None = None, markers: Markers | None = None
) -> Response:
    """A whole (non-streaming) chat completion with ``len(turns)`` choices."""
    finished = await whole_replies(engine, Prepared(turns, plan, markers))
    runtime = engine.runtime
    choices = [
        wire.Choice(
            index=i,
            message=_message(reply),
            logprobs=wire.ChoiceLogprobs(content=_logprobs(runtime, reply.done.logprobs))
            if turns[i].params.logprobs
            else None,
            finish_reason=_finish(reply),  # type: ignore[arg-type]
        )
        for i, reply in enumerate(finished)
    ]
    usage, timings = wire.usage_of([reply.done for reply in finished])
    body = wire.ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=usage,
        timings=timings,
    )
    return Response(wire.encode(body), media_type="application/json")


async def stream(
    engine,
    turns: Sequence[TurnRequest],
    model: str,
    plan: ToolPlan | None = None,
    markers: Markers | None = None,
    *,
    max_pending: int | None = None,
) -> AsyncIterator[bytes]:
    """Server-sent events of a streaming chat completion, ending with ``data: [DONE]``. The first engine batch is
    awaited before this returns (``chat.server.reply.reader.open_replies``). A reply that may call tools is held back
    until it is done, then sent as its text and its calls (OpenAI's tool-call deltas, each call whole). Every batch
    of reply events is one write. More than ``max_pending`` events left unread cancels the turns and ends the stream
    with a ``slow_client`` error (chat.server.transport.backpressure).

    Raises:
        whatever the turns raise before computing anything.
    """
    replies = await open_replies(engine, Prepared(turns, plan, markers), max_pending=max_pending)
    return _sse(engine.runtime, replies, turns, model)


class ChunkEncoder:
    """The ``data:`` lines of one stream's chunks (:class:`~chat.server.surfaces.openai_types.ChatCompletionChunk`).
    Its id, time and model are the same in every chunk, so a chunk is its choice's index, delta and log-probabilities
    written between bytes cut once from an encoded chunk (the bytes orjson writes for the whole chunk: see
    :meth:`whole`); a plain content delta (the chunk of almost every token) writes only its text."""

    INDEX, TEXT = 987654321, "\ue000"  # stand-ins, cut out of the encoded chunk

    def __init__(self, cid: str, created: int, model: str) -> None:
        self.id, self.created, self.model = cid, created, model
        probe = self.whole(self.INDEX, wire.ContentDelta(content=self.TEXT))
        head, rest = probe.split(b"%d" % self.INDEX)
        delta, tail = rest.split(orjson.dumps(wire.ContentDelta(content=self.TEXT)))
        logprobs, end = tail.split(b"null", 1)  # ',"logprobs":' and ',"finish_reason":null}]}\n\n'
        text_at = orjson.dumps(wire.ContentDelta(content=self.TEXT)).split(orjson.dumps(self.TEXT))
        self._head, self._delta, self._logprobs, self._end = head, delta, logprobs, end
        self._middle, self._tail = delta + text_at[0], text_at[1] + tail

    def content(self, index: int, text: str) -> bytes:
        """A chunk that carries ``text`` of choice ``index`` and nothing else."""
        return b"%s%d%s%s%s" % (self._head, index, self._middle, orjson.dumps(text), self._tail)

    def encoded(self, index: int, delta: wire.Delta, logprobs: wire.ChunkLogprobs | None = None) -> bytes:
        """The chunk of one choice's delta (the same bytes as :meth:`whole`)."""
        return b"%s%d%s%s%s%s%s" % (
            self._head,
            index,
            self._delta,
            orjson.dumps(delta),
            self._logprobs,
            orjson.dumps(logprobs),
            self._end,
        )

    def whole(self, index: int, delta: wire.Delta, logprobs: wire.ChunkLogprobs | None = None) -> bytes:
        """The chunk encoded whole from its model."""
        choice = wire.ChunkChoice(index=index, delta=delta, logprobs=logprobs)
        chunk = wire.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])
        return b"data: %s\n\n" % orjson.dumps(chunk)

    def final(self, index: int, finish: str, usage: tuple[wire.CompletionUsage, wire.Timings] | None) -> bytes:
        """A choice's last chunk; the stream's last carries the usage and timings."""
        choice = wire.ChunkChoice(index=index, delta=wire.EmptyDelta(), finish_reason=finish)  # type: ignore[arg-type]
        head = {"id": self.id, "created": self.created, "model": self.model, "choices": [choice]}
        if usage is None:
            return b"data: %s\n\n" % orjson.dumps(wire.ChatCompletionChunk(**head))
        return b"data: %s\n\n" % wire.encode(wire.FinalChunk(**head, usage=usage[0], timings=usage[1]))


GENERATION_FAILED = {"message": "generation failed; the server logged the details", "type": "server_error"}


async def _sse(runtime, replies, turns: Sequence[TurnRequest], model: str) -> AsyncIterator[bytes]:
    """The chat surface's encoder: reply events -> chunks."""
    encoder = ChunkEncoder(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model)
    encoded = encoder.encoded
    wants_logprobs = [t.params.logprobs for t in turns]
    yield b"".join(encoded(i, wire.RoleDelta()) for i in range(len(turns)))
    finished: dict[int, Finished] = {}
    async with contextlib.aclosing(replies):
        async for batch in replies:
            out: list[bytes] = []  # this batch's chunks, written at once
            for i, event in batch:
                if isinstance(event, TextOut):
                    if wants_logprobs[i] and (event.logprobs or event.token_ids):  # not text held back by a splitter
                        logprobs = wire.ChunkLogprobs(_logprobs(runtime, event.logprobs))
                        out.append(encoded(i, wire.ContentDelta(event.text), logprobs))
                    elif event.text:
                        out.append(encoder.content(i, event.text))
                elif isinstance(event, ReasoningOut):
                    out.append(encoded(i, wire.ReasoningDelta(event.text)))
                elif isinstance(event, CallsOut):
                    calls = [
                        wire.ToolCallDelta(index=c["index"], id=c["id"], function=wire.Function(**c["function"]))
                        for c in tools_api.wire_calls(event.calls, with_index=True)
                    ]
                    out.append(encoded(i, wire.ToolCallsDelta(tool_calls=calls)))
                elif isinstance(event, Finished):
                    finished[i] = event
                    last = len(finished) == len(turns)
                    usage = wire.usage_of([finished[k].done for k in sorted(finished)]) if last else None
                    out.append(encoder.final(i, _finish(event), usage))
                elif isinstance(event, Failed):
                    error = GENERATION_FAILED if event.done is not None else event.error.body()
                    body = wire.StreamError(error=wire.StreamErrorBody(**error))
                    out.append(b"data: %s\n\ndata: [DONE]\n\n" % wire.encode(body))
                    yield b"".join(out)
                    return
            if out:
                yield b"".join(out)
    yield b"data: [DONE]\n\n"
