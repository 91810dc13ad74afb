"""Anthropic's Messages API, the request side: what is refused (:func:`check`), the chat request a messages or
count_tokens request amounts to (:func:`to_chat`; the conversion rules are ``anthropic_api``'s docstring's and
docs/anthropic.md's), its ``cache_control`` breakpoints in tokens of the rendered prompt (:func:`breakpoint_tokens`),
and ``count_tokens``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from cache import shared_prefix_length
from chat.engine.events import CacheBreakpoint, TurnRequest
from chat.engine.volatile_lines import VolatileLines
from chat.protocol.errors import ErrorCode
from chat.protocol.limits import MAX_REPLY_TOKENS
from chat.server.errors import RequestError, validation_error
from chat.server.reply.reader import Prepared
from chat.server.surfaces import anthropic_types as wire
from chat.server.surfaces import openai_api

BLOCK_GAP = "\n\n"  # between two text blocks of one message (or of the system prompt)


# --- checks ----------------------------------------------------------------------------------------------------


def _refuse(field: str, why: str = "is not supported by this server (see docs/anthropic.md)") -> RequestError:
    return RequestError(ErrorCode.UNSUPPORTED_PARAMETER, f"{field}: {why}", param=field)


def _neutral(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {}


def check(body: wire.MessagesRequest | wire.CountTokensRequest) -> None:
    """Refuse what this server does not honour (a 400 naming the field).

    Raises:
        RequestError: ``unsupported_parameter`` or ``invalid_request``, naming the field.
    """
    for name in ("container", "mcp_servers", "diagnostics", "inference_geo", "user_profile_id"):
        if not _neutral(getattr(body, name, None)):
            raise _refuse(name)
    if not _neutral(getattr(body, "workspace_id", None)):
        raise _refuse("workspace_id")
    if getattr(body, "speed", None) not in (None, "standard"):
        raise _refuse("speed")
    for i, tool in enumerate(body.tools or ()):
        for name in ("defer_loading", "input_examples", "eager_input_streaming"):
            if not _neutral(getattr(tool, name)):
                raise _refuse(f"tools.{i}.{name}")
        if tool.allowed_callers not in (None, [], ["direct"]):
            raise _refuse(f"tools.{i}.allowed_callers")
    for i, edit in enumerate((body.context_management.edits or ()) if body.context_management else ()):
        if isinstance(edit, wire.OtherEdit):
            raise _refuse(f"context_management.edits.{i}.type", f"edit {edit.type!r} is not supported")
    for i, message in enumerate(body.messages):
        for j, block in enumerate(message.content if isinstance(message.content, list) else ()):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, wire.TextBlock) and not _neutral(block.citations):
                raise _refuse(f"{where}.citations")
            if isinstance(block, wire.ToolUseBlock) and not _neutral(block.caller):
                raise _refuse(f"{where}.caller")
            if message.role == "user" and isinstance(block, wire.ToolUseBlock | wire.ThinkingBlock):
                raise _bad(where, f"a user message cannot hold a {block.type} block")
            if message.role == "assistant" and isinstance(block, wire.ToolResultBlock | wire.ImageBlock):
                raise _bad(where, f"an assistant message cannot hold a {block.type} block")
            if message.role == "system" and not isinstance(block, wire.TextBlock):
                raise _bad(where, f"a system message holds text blocks only, not a {block.type} block")
    for i, block in enumerate(body.system if isinstance(body.system, list) else ()):
        if not _neutral(block.citations):
            raise _refuse(f"system.{i}.citations")
    marks = len(_marks(body))
    if marks > wire.MAX_BREAKPOINTS:
        raise _bad("cache_control", f"{marks} blocks carry cache_control; at most {wire.MAX_BREAKPOINTS} may")
    thinking = body.thinking
    max_tokens = getattr(body, "max_tokens", None)
    if isinstance(thinking, wire.ThinkingEnabled) and max_tokens is not None and thinking.budget_tokens >= max_tokens:
        raise _bad("thinking.budget_tokens", "must be less than max_tokens")


def _bad(field: str, why: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_REQUEST, f"{field}: {why}", param=field)


# --- conversion ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mark:
    """A ``cache_control`` breakpoint, as a place in the converted chat messages: the prompt up to the end of part
    ``part`` of chat message ``message`` (``part`` None: the whole message; ``message`` -1: before any message)."""

    where: str  # the marked block on the wire ("system.1", "tools.23", "messages.4.content.0", "cache_control")
    message: int
    part: int | None
    ttl_s: int


def _marks(body) -> list[tuple[str, wire.CacheControl]]:
    """Every breakpoint of the request, in prompt order (tools, system, messages), as (where, cache_control)."""
    out: list[tuple[str, wire.CacheControl]] = []
    out += [(f"tools.{i}", t.cache_control) for i, t in enumerate(body.tools or ()) if t.cache_control]
    if isinstance(body.system, list):
        out += [(f"system.{i}", b.cache_control) for i, b in enumerate(body.system) if b.cache_control]
    for i, message in enumerate(body.messages):
        for j, block in enumerate(message.content if isinstance(message.content, list) else ()):
            if block.cache_control is not None:
                out.append((f"messages.{i}.content.{j}", block.cache_control))
    if body.cache_control is not None:
        out.append(("cache_control", body.cache_control))
    return out


def _image_part(block: wire.ImageBlock) -> dict:
    source = block.source
    url = source.url if isinstance(source, wire.URLSource) else f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _texts(parts: list[dict]) -> list[dict]:
    """Text parts with the gap between blocks in front of every text part after the first."""
    out = []
    for k, part in enumerate(parts):
        if k and part["type"] == "text":
            part = {"type": "text", "text": BLOCK_GAP + part["text"]}
        out.append(part)
    return out


def _result_text(block: wire.ToolResultBlock, where: str) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        for k, part in enumerate(content):
            if isinstance(part, wire.ImageBlock):
                raise _refuse(f"{where}.content.{k}", "images in tool results are not supported")
        text = BLOCK_GAP.join(part.text for part in content)  # type: ignore[union-attr]
    return f"Error: {text}" if block.is_error else text


def _thinking_kept(body) -> list[bool]:
    """Per message: whether its thinking blocks reach the prompt (``clear_thinking`` keeps the last N assistant
    turns'; without the edit, every turn's)."""
    keep: int | None = None
    for edit in (body.context_management.edits or ()) if body.context_management else ():
        if isinstance(edit, wire.ClearThinkingEdit):
            keep = edit.turns_kept()
    assistants = [i for i, m in enumerate(body.messages) if m.role == "assistant"]
    kept = set(assistants if keep is None else assistants[len(assistants) - keep :])
    return [i in kept for i in range(len(body.messages))]


def chat_messages(body, markers) -> tuple[list[dict], list[Mark]]:
    """The chat messages the request's system and messages amount to, and where its breakpoints fall in them."""
    out: list[dict] = []
    marks: list[Mark] = []
    has_system = bool(body.system)
    for i, tool in enumerate(body.tools or ()):  # the tools render with the system prompt: a breakpoint on them
        if tool.cache_control:  # holds the system message (none: nothing before the first message)
            marks.append(Mark(f"tools.{i}", 0 if has_system else -1, None, tool.cache_control.ttl_s))
    if isinstance(body.system, str) and body.system:
        out.append({"role": "system", "content": body.system})
    elif isinstance(body.system, list) and body.system:
        parts = _texts([{"type": "text", "text": b.text} for b in body.system])
        out.append({"role": "system", "content": parts})
        for j, block in enumerate(body.system):
            if block.cache_control:
                marks.append(Mark(f"system.{j}", 0, j, block.cache_control.ttl_s))
    kept = _thinking_kept(body)
    for i, message in enumerate(body.messages):
        where = f"messages.{i}"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        if message.role == "system":  # a mid-conversation system message: a system message where it stands
            out.append(
                {"role": "system", "content": _texts([{"type": "text", "text": b.text} for b in message.content])}
            )
            marks += [
                Mark(f"{where}.content.{j}", len(out) - 1, j, b.cache_control.ttl_s)
                for j, b in enumerate(message.content)
                if b.cache_control
            ]
            continue
        if message.role == "assistant":
            thinking, text, calls, last = [], [], [], None
            for j, block in enumerate(message.content):
                if isinstance(block, wire.ThinkingBlock) and kept[i] and markers is not None:
                    thinking.append(block.thinking)
                elif isinstance(block, wire.TextBlock):
                    text.append(block.text)
                elif isinstance(block, wire.ToolUseBlock):  # compact, as a reply's calls are parsed
                    arguments = json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
                    calls.append(
                        {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
                    )
                if block.cache_control:
                    last = Mark(f"{where}.content.{j}", len(out), None, block.cache_control.ttl_s)
            content = BLOCK_GAP.join(text)
            if thinking:
                content = f"{markers.start}{BLOCK_GAP.join(thinking)}{markers.end}{content}"
            reply: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                reply["tool_calls"] = calls
            out.append(reply)
            if last is not None:
                marks.append(last)
            continue
        parts: list[dict] = []
        part_marks: list[tuple[int, str, wire.CacheControl]] = []
        for j, block in enumerate(message.content):
            if isinstance(block, wire.ToolResultBlock):
                if parts:
                    out.append({"role": "user", "content": _texts(parts)})
                    marks += [Mark(w, len(out) - 1, k, c.ttl_s) for k, w, c in part_marks]
                    parts, part_marks = [], []
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.tool_use_id,
                        "content": _result_text(block, f"{where}.content.{j}"),
                    }
                )
                if block.cache_control:
                    marks.append(Mark(f"{where}.content.{j}", len(out) - 1, None, block.cache_control.ttl_s))
                continue
            if isinstance(block, wire.TextBlock):
                parts.append({"type": "text", "text": block.text})
            elif isinstance(block, wire.ImageBlock):
                parts.append(_image_part(block))
            else:  # redacted thinking in a user message: nothing to render
                continue
            if block.cache_control:
                part_marks.append((len(parts) - 1, f"{where}.content.{j}", block.cache_control))
        if parts:
            out.append({"role": "user", "content": _texts(parts)})
            marks += [Mark(w, len(out) - 1, k, c.ttl_s) for k, w, c in part_marks]
    if body.cache_control is not None:
        marks.append(Mark("cache_control", len(out) - 1, None, body.cache_control.ttl_s))
    return out, marks


def _tool_choice(choice) -> tuple[Any, bool | None]:
    """OpenAI's ``tool_choice`` and ``parallel_tool_calls`` for Anthropic's ``tool_choice``."""
    if choice is None:
        return None, None
    parallel = (
        None if getattr(choice, "disable_parallel_tool_use", None) is None else not choice.disable_parallel_tool_use
    )
    if isinstance(choice, wire.ToolChoiceAny):
        return "required", parallel
    if isinstance(choice, wire.ToolChoiceTool):
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return choice.type, parallel  # auto / none


def _response_format(config: wire.OutputConfig | None) -> dict | None:
    """OpenAI's ``response_format`` for ``output_config.format`` (a JSON schema the reply's text matches)."""
    if config is None or config.format is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": config.format.schema_, "strict": True}}


@dataclass(frozen=True, slots=True)
class Converted:
    chat: openai_api.ChatCompletionRequest  # the chat request the Anthropic request amounts to
    marks: list[Mark]  # its breakpoints, in the chat messages
    max_tokens: int  # the reply cap asked for (the engine caps it further to the context's room)
    thinking: str | None  # how `thinking` is honoured: "template", "unsupported", "off", or None (not asked)
    thinking_budget: int | None  # the budget as applied
    effort: bool = False  # output_config.effort was given (accepted, not applied)


def to_chat(body, runtime) -> Converted:
    """The chat request ``body`` (a messages or count_tokens request) amounts to.

    Raises:
        RequestError: what the chat API refuses, named as far as it can be.
    """
    markers = getattr(runtime, "reasoning", None)
    messages, marks = chat_messages(body, markers)
    window = getattr(runtime, "context_window", None) or MAX_REPLY_TOKENS + 1
    max_tokens = min(getattr(body, "max_tokens", 1), MAX_REPLY_TOKENS, window - 1)
    thinking, budget, kwargs = None, None, None
    asked = body.thinking
    if markers is None:
        thinking = "unsupported" if isinstance(asked, wire.ThinkingEnabled | wire.ThinkingAdaptive) else None
    elif isinstance(asked, wire.ThinkingEnabled):
        thinking, budget = "template", min(asked.budget_tokens, max(1, max_tokens - 1))
    elif isinstance(asked, wire.ThinkingAdaptive):
        thinking = "template"
    else:  # thinking disabled or not asked for: Anthropic's default is no thinking
        thinking, kwargs = ("off" if asked is not None else None), {"enable_thinking": False}
    choice, parallel = _tool_choice(body.tool_choice)
    tools = [
        {
            "type": "function",
            "function": {
                k: v
                for k, v in (
                    ("name", t.name),
                    ("description", t.description),
                    ("parameters", t.input_schema),
                    ("strict", t.strict),
                )
                if v is not None
            },
        }
        for t in body.tools or ()
    ]
    fields: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": getattr(body, "temperature", None),
        "top_p": getattr(body, "top_p", None),
        "top_k": getattr(body, "top_k", None),
        "stop": getattr(body, "stop_sequences", None) or None,
        "tools": tools or None,
        "tool_choice": choice if tools or choice not in ("auto", "none") else None,
        "parallel_tool_calls": parallel if tools else None,
        "chat_template_kwargs": kwargs,
        "thinking_budget": budget,
        "response_format": _response_format(getattr(body, "output_config", None)),
    }
    try:
        chat = openai_api.ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise validation_error(list(exc.errors())) from None
    config = getattr(body, "output_config", None)
    effort = config is not None and config.effort is not None
    return Converted(chat, marks, max_tokens, thinking, budget, effort)


def prepare(converted: Converted, salt: str, runtime) -> Prepared:
    """The request as the pipeline runs it: one turn.

    Raises:
        UnsupportedMediaError, RequestError, SamplingFieldError.
    """
    chat = converted.chat
    chat.check(1)
    return openai_api.prepare(chat, salt, runtime)


def _truncated(chat: openai_api.ChatCompletionRequest, mark: Mark) -> openai_api.ChatCompletionRequest:
    """The chat request cut after ``mark``'s block (what the prompt holds up to the breakpoint)."""
    messages = list(chat.messages[: mark.message + 1])
    if mark.part is not None and messages:
        last = messages[-1]
        assert isinstance(last.content, list)
        messages[-1] = last.model_copy(update={"content": last.content[: mark.part + 1]})
    return chat.model_copy(update={"messages": messages or chat.messages[:0]})


def _render(runtime, turn: TurnRequest, volatile: VolatileLines | None = None) -> list[int] | None:
    """The turn's prompt as the engine renders it (``volatile``: the engine's volatile lines, dropped as it drops
    them), or None where this process cannot render."""
    render = getattr(runtime, "render_prompt", None)
    if render is None:  # a cluster's ingress: its replicas render
        return None
    extra: dict = {"tools": turn.tools} if turn.tools else {}
    if turn.template_kwargs:
        extra["template_kwargs"] = turn.template_kwargs
    messages = turn.messages if volatile is None else volatile.prompt_messages(turn.messages)
    return list(render(messages, **extra).tokens)


def breakpoint_tokens(
    converted: Converted, turn: TurnRequest, salt: str, runtime, volatile: VolatileLines | None = None
) -> tuple[CacheBreakpoint, ...]:
    """The request's breakpoints in tokens of its rendered prompt: for each, the tokens the whole prompt shares with
    the prompt rendered up to the marked block (the same tools, template and settings, and the engine's volatile
    lines dropped as the engine drops them). Empty when this process cannot render (a cluster's ingress).

    Raises:
        whatever rendering raises (media errors): the engine would raise the same.
    """
    if not converted.marks:
        return ()
    full = _render(runtime, turn, volatile)
    if full is None:
        return ()
    out = []
    for mark in converted.marks:
        if mark.message < 0:
            tokens = 0
        else:
            cut = _truncated(converted.chat, mark)
            (head,) = openai_api.prepare(cut, salt, runtime).turns
            tokens = shared_prefix_length(full, _render(runtime, head, volatile) or [])
        out.append(CacheBreakpoint(tokens, mark.ttl_s, mark.where))
    return tuple(sorted(out, key=lambda b: b.tokens))


def count_tokens(body: wire.CountTokensRequest, salt: str, runtime, volatile: VolatileLines | None = None) -> dict:
    """``{"input_tokens": N}``: the tokens of the prompt the request would render (tools and template included,
    volatile lines dropped as the engine drops them).

    Raises:
        RequestError, UnsupportedMediaError, SamplingFieldError; media errors.
    """
    converted = to_chat(body, runtime)
    (turn,) = prepare(converted, salt, runtime).turns
    tokens = _render(runtime, turn, volatile)
    if tokens is None:
        raise RequestError(ErrorCode.INVALID_REQUEST, "count_tokens needs the model's tokenizer in this process")
    return wire.CountTokensResponse(input_tokens=len(tokens)).model_dump()


def with_breakpoints(turns: Sequence[TurnRequest], breakpoints: tuple[CacheBreakpoint, ...]) -> list[TurnRequest]:
    """The turns with the request's breakpoints on them (``TurnRequest.breakpoints``: the pinning hook)."""
    return [replace(t, breakpoints=breakpoints) for t in turns]
