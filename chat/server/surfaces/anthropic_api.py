"""Anthropic's Messages API: ``POST /v1/messages`` (streaming or not; ``?beta=true`` accepted) and
``POST /v1/messages/count_tokens``, what Claude Code and the ``anthropic`` SDK speak.

A request is converted into the chat request it amounts to (``anthropic_convert.to_chat``) and runs through the
same pipeline as ``/v1/chat/completions`` (``chat.server.reply``): the same turns, tools (``input_schema``
constrained as OpenAI ``parameters`` are), thinking (the template's), engine, cache, tenants, limits and priorities.
Its reply is read back by the one reply reader and encoded here as Anthropic's message or its stream events.

The conversion: ``system`` (a string, or text blocks joined by blank lines) is the system message; a user message's
``text`` and ``image`` blocks are its content (blocks joined by blank lines), its ``tool_result`` blocks are tool
messages (``is_error`` results start with ``Error: ``), in the order they come; an assistant message's ``text`` is
its content, its ``tool_use`` blocks its calls, its ``thinking`` kept in front of its text between the model's
thinking markers where ``context_management``'s ``clear_thinking`` edit keeps it (the template then renders or drops
it, as it does the thinking of its own replies) and dropped otherwise; ``redacted_thinking`` is dropped.

``cache_control`` breakpoints are checked (at most 4; ``ttl`` ``5m`` or ``1h``), measured in tokens of the rendered
prompt (``anthropic_convert.breakpoint_tokens``) and carried on the engine's turn (``TurnRequest.breakpoints``);
usage reports the prompt as Anthropic counts it (:func:`usage`). The request side (checks, conversion,
breakpoints, count_tokens) is ``anthropic_convert``; this module is the errors, usage and the reply's encoders.
docs/anthropic.md lists every field.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from pydantic import BaseModel

from chat.engine.events import CacheBreakpoint, PinOutcome, Usage
from chat.engine.tool_calls import ToolCall
from chat.protocol.errors import ErrorCode
from chat.server.errors import describe
from chat.server.reply.reader import (
    CallsOut,
    Failed,
    Finished,
    Prefilled,
    Prepared,
    ReasoningOut,
    TextOut,
    Waiting,
    open_replies,
    whole_replies,
)
from chat.server.surfaces import anthropic_types as wire
from chat.server.surfaces.anthropic_convert import Converted

KEEPALIVE_S = 5.0  # a ping this often while the first token is awaited (a long prefill)
ROUTES = ("/v1/messages", "/v1/messages/count_tokens")


# --- errors ----------------------------------------------------------------------------------------------------

ERROR_TYPES = {  # HTTP status -> Anthropic's error type (its statuses: 529 for overloaded)
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_status_and_body(exc: BaseException) -> tuple[int, dict]:
    """Anthropic's status and error body for ``exc`` (its wire code from ``chat/server/errors.py``'s table; our code
    and field, when known, in the message)."""
    reported = describe(exc)
    status = reported.transport.status
    kind = ERROR_TYPES.get(status, "api_error")
    status = 529 if kind == "overloaded_error" else status
    message = reported.message
    if reported.code is not ErrorCode.INTERNAL:
        message = f"{message} ({reported.code.value}{', param: ' + reported.param if reported.param else ''})"
    body = wire.ErrorResponse(error=wire.ErrorObject(type=kind, message=message))
    return status, body.model_dump()


def is_anthropic(path: str) -> bool:
    return path in ROUTES


# --- reply -----------------------------------------------------------------------------------------------------


def usage(
    used: Usage | None,
    breakpoints: Sequence[CacheBreakpoint],
    converted: Converted,
    window: int | None,
    pins: Sequence[PinOutcome] = (),
):
    """Usage as Anthropic counts it: ``cache_read_input_tokens`` read from the cache, ``cache_creation_input_tokens``
    computed this request before the last breakpoint (each written to the cache), ``input_tokens`` the rest of the
    prompt; our extra figures in ``turncache``. ``used``: the engine's (a Done's, or the prompt's alone before the
    reply: output 0); None: nothing known (zeros). ``pins``: what became of each breakpoint (a Done's)."""
    if used is None:
        prompt = cached = output = 0
        reason = at = None
    else:
        u = used
        prompt, cached, output, reason, at = (
            u.prompt_tokens,
            u.cached_tokens,
            u.completion_tokens,
            u.cache_miss_reason,
            u.cache_miss_at,
        )
    last = min(breakpoints[-1].tokens, prompt) if breakpoints else 0
    created = max(0, last - cached)
    per_ttl = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
    if created:
        longest = max(b.ttl_s for b in breakpoints if b.tokens > cached)
        per_ttl["ephemeral_1h_input_tokens" if longest >= 3600 else "ephemeral_5m_input_tokens"] = created
    cap = converted.max_tokens if not prompt or window is None else min(converted.max_tokens, window - prompt)
    pins_out = [
        wire.PinOut(
            where=p.breakpoint.where, tokens=p.length, ttl_s=p.breakpoint.ttl_s, pinned=p.pinned, reason=p.reason
        )
        for p in pins
    ] or None
    extra = wire.TurncacheUsage(
        cache_miss_reason=reason,
        cache_miss_at=at,
        max_tokens=cap,
        thinking=converted.thinking,
        thinking_budget_tokens=converted.thinking_budget,
        effort="not_applied" if converted.effort else None,
        breakpoints=pins_out,
    )
    return wire.Usage(
        input_tokens=prompt - cached - created,
        output_tokens=output,
        cache_creation_input_tokens=created,
        cache_read_input_tokens=cached,
        cache_creation=per_ttl,
        turncache=extra,
    )


def signature(thinking: str) -> str:
    """A thinking block's signature: a digest of its text (nothing is verified when it comes back)."""
    return "turncache-" + hashlib.sha256(thinking.encode()).hexdigest()


def _tool_use(call: ToolCall) -> wire.ToolUseOut:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = {}
    return wire.ToolUseOut(id=f"toolu_{uuid.uuid4().hex[:24]}", name=call.name, input=arguments)


def _stop(finished: Finished, stops: Sequence[str], runtime) -> tuple[str, str | None]:
    """Anthropic's stop reason and the stop sequence that ended the reply (if one did)."""
    if finished.finish == "length":
        return "max_tokens", None
    if finished.calls:
        return "tool_use", None
    done = finished.done
    eos = getattr(runtime, "eos_token_ids", ())
    if stops and done.token_ids and done.token_ids[-1] not in eos and hasattr(runtime, "decode"):
        written = runtime.decode(list(done.token_ids))
        tail = written[max(0, len(done.text) - max(len(s) for s in stops)) :]
        found = [(tail.find(s), s) for s in stops if s in tail]
        if found:
            return "stop_sequence", min(found)[1]
    return "end_turn", None


@dataclass
class Reply:
    """What one request's reply is encoded with."""

    model: str
    converted: Converted
    breakpoints: tuple[CacheBreakpoint, ...]
    runtime: Any
    stops: tuple[str, ...]

    @property
    def window(self) -> int | None:
        return getattr(self.runtime, "context_window", None)


async def complete(engine, prepared: Prepared, reply: Reply) -> dict:
    """A whole reply (``type: message``)."""
    (finished,) = await whole_replies(engine, prepared)
    content: list[Any] = []
    if finished.reasoning:
        content.append(wire.ThinkingOut(thinking=finished.reasoning, signature=signature(finished.reasoning)))
    if finished.content:
        content.append(wire.TextOut(text=finished.content))
    content += [_tool_use(call) for call in finished.calls]
    stop, sequence = _stop(finished, reply.stops, reply.runtime)
    message = wire.Message(
        id=f"msg_{uuid.uuid4().hex[:24]}",
        model=reply.model,
        content=content,
        stop_reason=stop,  # type: ignore[arg-type]
        stop_sequence=sequence,
        usage=usage(finished.done.usage, reply.breakpoints, reply.converted, reply.window, finished.done.pins),
    )
    return message.model_dump(exclude_none=True)


async def stream(engine, prepared: Prepared, reply: Reply, *, max_pending: int | None = None) -> AsyncIterator[bytes]:
    """Anthropic's stream events. The first engine batch is awaited for :data:`KEEPALIVE_S` at most (a refusal
    before anything is computed is an HTTP error); after that the stream starts and a ``ping`` goes out every
    :data:`KEEPALIVE_S` until the first token.

    Raises:
        whatever the turn raises before computing anything.
    """
    turns = [replace(turn, report_prefill=True) for turn in prepared.turns]  # message_start says the prompt's usage
    replies = await open_replies(
        engine, replace(prepared, turns=turns), max_pending=max_pending, keepalive_s=KEEPALIVE_S
    )
    return _sse(replies, reply)


def _event(event: BaseModel) -> bytes:
    data = event.model_dump(exclude_none=True)
    return b"event: %s\ndata: %s\n\n" % (data["type"].encode(), orjson.dumps(data))


class _Blocks:
    """The stream's content blocks: which one is open, and the events that open and close them."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" | "thinking" | None
        self.thought: list[str] = []  # the open thinking block's text (its signature at its end)

    def close(self) -> list[bytes]:
        out = []
        if self.open == "thinking":
            sig = wire.SignatureDelta(signature=signature("".join(self.thought)))
            out.append(_event(wire.BlockDelta(index=self.index, delta=sig)))
        if self.open is not None:
            out.append(_event(wire.BlockStop(index=self.index)))
        self.open, self.thought = None, []
        return out

    def start(self, kind: str, block: dict) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = kind if kind in ("text", "thinking") else None
        out.append(_event(wire.BlockStart(index=self.index, content_block=block)))
        return out

    def text(self, text: str) -> list[bytes]:
        out = [] if self.open == "text" else self.start("text", {"type": "text", "text": ""})
        return [*out, _event(wire.BlockDelta(index=self.index, delta=wire.TextDelta(text=text)))]

    def thinking(self, text: str) -> list[bytes]:
        out = (
            []
            if self.open == "thinking"
            else self.start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        )
        self.thought.append(text)
        return [*out, _event(wire.BlockDelta(index=self.index, delta=wire.ThinkingDelta(thinking=text)))]

    def tool_use(self, call: ToolCall) -> list[bytes]:
        use = _tool_use(call)
        out = self.start("tool_use", {"type": "tool_use", "id": use.id, "name": use.name, "input": {}})
        partial = wire.InputJsonDelta(partial_json=json.dumps(use.input, ensure_ascii=False))
        out.append(_event(wire.BlockDelta(index=self.index, delta=partial)))
        out.append(_event(wire.BlockStop(index=self.index)))
        return out


def stream_error(exc: BaseException) -> bytes:
    _, body = error_status_and_body(exc)
    return b"event: error\ndata: %s\n\n" % orjson.dumps(body)


async def _sse(replies, reply: Reply) -> AsyncIterator[bytes]:
    """The Anthropic surface's encoder: reply events -> stream events. ``message_start`` waits for the prompt's usage
    (:class:`Prefilled`, which comes with or before the first token; pings may go out before it while the turn
    waits to start); a reply that ends without it (failed or cancelled before its prefill) starts with its Done's."""
    mid = f"msg_{uuid.uuid4().hex[:24]}"

    def message_start(used: Usage | None) -> bytes:
        start = usage(used, reply.breakpoints, reply.converted, reply.window)
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": start.model_dump(exclude_none=True),
        }
        return _event(wire.MessageStart(message=message))

    started = False
    blocks = _Blocks()
    async with contextlib.aclosing(replies):
        try:
            async for batch in replies:
                out: list[bytes] = []
                for _, event in batch:
                    if isinstance(event, Waiting):
                        out.append(_event(wire.Ping()))
                        continue
                    if isinstance(event, Prefilled):
                        if not started:
                            started = True
                            out.append(message_start(event.usage))
                        continue
                    if not started:
                        started = True
                        ended = event.done if isinstance(event, Finished | Failed) else None
                        out.append(message_start(ended.usage if ended is not None else None))
                    if isinstance(event, TextOut):
                        if event.text:
                            out += blocks.text(event.text)
                    elif isinstance(event, ReasoningOut):
                        out += blocks.thinking(event.text)
                    elif isinstance(event, CallsOut):
                        for call in event.calls:
                            out += blocks.tool_use(call)
                    elif isinstance(event, Finished):
                        out += blocks.close()
                        stop, sequence = _stop(event, reply.stops, reply.runtime)
                        body = wire.MessageDeltaBody(stop_reason=stop, stop_sequence=sequence)  # type: ignore[arg-type]
                        used = usage(
                            event.done.usage, reply.breakpoints, reply.converted, reply.window, event.done.pins
                        )
                        out.append(_event(wire.MessageDelta(delta=body, usage=used)))
                        out.append(_event(wire.MessageStop()))
                    else:
                        assert isinstance(event, Failed)
                        out.append(stream_error(event.error if event.done is None else RuntimeError("generation")))
                        yield b"".join(out)
                        return
                if out:
                    yield b"".join(out)
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # refused after the stream began (a prompt over the context, after a ping)
            yield stream_error(exc)
