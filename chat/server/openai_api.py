"""OpenAI-compatible HTTP: ``POST /v1/chat/completions`` (streaming SSE or not) and ``GET /v1/models``.

Every response carries ``usage.prompt_tokens_details.cached_tokens``: in a non-streaming response, and in the last
chunk of a stream (whether or not ``stream_options.include_usage`` was asked for; clients ignore what they do not
know). Each request is stateless: the client sends the whole conversation, and the prefix cache finds what it has.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from chat.engine.content import engine_messages
from chat.engine.engine import Engine
from chat.engine.events import Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.server.errors import RequestError

MAX_MESSAGES = 1_000
MAX_TEXT_CHARS = 1_000_000


class TextPart(BaseModel):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(BaseModel):
    data: str  # base64
    format: str  # "wav", "mp3", ...


class AudioPart(BaseModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class VideoURL(BaseModel):
    url: str


class VideoPart(BaseModel):
    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImagePart | AudioPart | VideoPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
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


def to_sampling(req: ChatCompletionRequest) -> SamplingParams:
    """Raises InvalidSamplingError (naming the field) for values out of range."""
    if req.n != 1:
        raise RequestError("invalid_request", "only n=1 is supported", param="n")
    kwargs: dict = {}
    for name in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(req, name)
        if value is not None:
            kwargs[name] = value
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if req.stop is not None:
        kwargs["stop"] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    return SamplingParams(**kwargs)


def usage_json(done: Done) -> dict:
    u = done.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def timings_json(done: Done) -> dict:
    t = done.timings
    return {
        "ttft_ms": round(t.ttft_ms, 3),
        "prefill_ms": round(t.prefill_ms, 3),
        "decode_tokens_per_s": round(t.decode_tokens_per_s, 3),
        "total_ms": round(t.total_ms, 3),
    }


def _finish_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"


def build_turn(req: ChatCompletionRequest, salt: str, runtime) -> TurnRequest:
    """Raises UnsupportedMediaError, InvalidSamplingError, RequestError."""
    messages = engine_messages([m.model_dump(exclude_none=True) for m in req.messages], runtime)
    return TurnRequest(messages, to_sampling(req), salt=salt)


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
        "usage": usage_json(done),
        "timings": timings_json(done),
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
            yield chunk({}, _finish_reason(event), usage=usage_json(event), timings=timings_json(event))
    yield "data: [DONE]\n\n"
