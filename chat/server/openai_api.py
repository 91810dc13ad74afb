"""OpenAI-compatible HTTP: ``POST /v1/chat/completions`` (streaming SSE or not) and ``GET /v1/models``.

Every response carries ``usage.prompt_tokens_details.cached_tokens``: in a non-streaming response, and in the last
chunk of a stream (whether or not ``stream_options.include_usage`` was asked for; clients ignore what they do not
know). Each request is stateless: the client sends the whole conversation, and the prefix cache finds what it has.

Messages use the WebSocket protocol's content types and limits (``chat.protocol.content``, ``chat.protocol.limits``)
in an OpenAI envelope (:class:`HttpMessage`); sampling fields are validated once, by the protocol's
``SamplingSettings``; usage and timings are converted by ``chat.server.turns``, errors reported by
``chat.server.errors`` — the same as on the WebSocket. Since every request carries the whole conversation, each of
its media items is decoded and hashed once per request (by validation); the engine neither decodes nor hashes an
item whose prepared form it holds.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from chat.engine.engine import Engine
from chat.engine.events import Done, TurnRequest
from chat.protocol.client_events import ModelName
from chat.protocol.content import ChatMessage, Content, PromptMessage, check_media_count
from chat.protocol.errors import ErrorCode
from chat.protocol.limits import MAX_MESSAGES
from chat.protocol.sampling import SamplingSettings
from chat.server.errors import RequestError
from chat.server.turns import turn_request, wire_timings, wire_usage

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop")  # same names as SamplingSettings'


class HttpMessage(ChatMessage):
    """One message of a request: the protocol's content types and rules (``ChatMessage``), with OpenAI's extras:
    the ``developer`` role (taken as ``system``), ``content: null``, ``name`` (ignored), unknown fields ignored."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]  # type: ignore[assignment]
    content: Content | None = None  # type: ignore[assignment]
    name: str | None = None

    def prompt(self) -> PromptMessage:
        role = "system" if self.role == "developer" else self.role
        return PromptMessage(role, "" if self.content is None else self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The body of ``POST /v1/chat/completions``. Sampling fields are taken as sent and validated once, by
    :meth:`sampling` (the protocol's ``SamplingSettings``)."""

    model_config = ConfigDict(extra="ignore")

    model: ModelName | None = None
    messages: list[HttpMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension: not in the OpenAI API
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1

    @model_validator(mode="after")
    def _media_count(self) -> ChatCompletionRequest:
        check_media_count(self.messages)
        return self

    def sampling(self) -> SamplingSettings:
        """The request's sampling settings (fields left out or null take the defaults).

        Raises:
            RequestError: ``invalid_sampling`` naming the field out of range; ``invalid_request`` for ``n != 1``.
        """
        if self.n != 1:
            raise RequestError(ErrorCode.INVALID_REQUEST, "only n=1 is supported", param="n")
        values = {name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None}
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if max_tokens is not None:
            values["max_tokens"] = max_tokens
        try:
            return SamplingSettings.model_validate(values)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = str(first["loc"][0]) if first["loc"] else "sampling"
            raise RequestError(ErrorCode.INVALID_SAMPLING, f"{field}: {first['msg']}", param=field) from None


def _finish_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"


def build_turn(req: ChatCompletionRequest, salt: str, runtime) -> TurnRequest:
    """Raises UnsupportedMediaError, RequestError."""
    return turn_request([m.prompt() for m in req.messages], req.sampling(), salt=salt, runtime=runtime)


def _usage_and_timings(done: Done) -> dict:
    return {
        "usage": wire_usage(done).model_dump(),
        "timings": wire_timings(done).model_dump(exclude_none=True),
    }


async def complete(engine: Engine, turn: TurnRequest, model: str) -> dict:
    """A whole (non-streaming) chat completion."""
    done: Done | None = None
    async for event in engine.generate(turn):
        if isinstance(event, Done):
            done = event
    assert done is not None
    if done.finish_reason == "error":
        raise done.error or RuntimeError("generation failed")
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": done.text},
                "finish_reason": _finish_reason(done),
            }
        ],
        **_usage_and_timings(done),
    }


async def stream(engine: Engine, turn: TurnRequest, model: str) -> AsyncIterator[str]:
    """Server-sent events of a streaming chat completion, ending with ``data: [DONE]``."""
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    async for event in engine.generate(turn):
        if not isinstance(event, Done):
            if event.text:
                yield chunk({"content": event.text})
            continue
        if event.finish_reason == "error":
            error = {"message": "generation failed; the server logged the details", "type": "server_error"}
            yield f"data: {json.dumps({'error': error})}\n\n"
        else:
            yield chunk({}, _finish_reason(event), **_usage_and_timings(event))
    yield "data: [DONE]\n\n"
