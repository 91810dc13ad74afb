"""Tools in ``/v1/chat/completions``: the request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` and the
history's calls and results checked before anything runs, the turn rendered in the model's call format
(``chat.engine.tool_calls``), and the reply read back into OpenAI's ``tool_calls``.

Checks (a typed 400 naming the field): a function whose ``parameters`` is not JSON Schema (``invalid_grammar``); a
``tool_choice`` naming no function, or given without ``tools``; a ``tool`` message whose ``tool_call_id`` answers no
call of an earlier assistant message; an assistant call whose ``arguments`` are not a JSON object (``invalid_request``).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from chat.engine.constraints import GrammarError, check_json_schema
from chat.engine.events import Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.tool_calls import FORMATS, ParsedReply, Tool, ToolCall, ToolChoice, ToolFormat
from chat.protocol.errors import ErrorCode
from chat.protocol.tools import NamedToolChoice, ToolDef
from chat.server.errors import RequestError

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How one request's tools are offered and read back."""

    format: ToolFormat  # the model's call syntax
    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool  # several calls in one reply
    definitions: tuple[dict, ...]  # the request's function definitions, for a template that renders them

    @property
    def calls_possible(self) -> bool:
        return bool(self.tools) and self.choice.mode != "none"


def _bad(message: str, param: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> RequestError:
    return RequestError(code, f"{param}: {message}", param=param)


def plan_tools(tools: Sequence[ToolDef] | None, choice: Any, parallel: bool | None, runtime) -> ToolPlan:
    """The request's tools, checked (none offered when it has none: its history's calls are still rendered).

    Raises:
        RequestError: see the module docstring.
    """
    fmt = FORMATS[getattr(runtime, "tool_format", "generic")]
    if not tools:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice needs tools", "tool_choice")
        return ToolPlan(fmt, (), ToolChoice("none"), False, ())
    plain = []
    for i, t in enumerate(tools):
        parameters = t.function.parameters if t.function.parameters is not None else {"type": "object"}
        try:
            check_json_schema(parameters)
        except GrammarError as exc:
            raise _bad(str(exc), f"tools[{i}].function.parameters", ErrorCode.INVALID_GRAMMAR) from None
        plain.append(Tool(t.function.name, t.function.description or "", parameters, bool(t.function.strict)))
    if len({t.name for t in plain}) != len(plain):
        raise _bad("two functions have the same name", "tools")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in {t.name for t in plain}:
            raise _bad(f"no function is named {choice.function.name!r}", "tool_choice")
        mode = ToolChoice("named", choice.function.name)
    else:
        mode = ToolChoice(choice or "auto")
    definitions = tuple(t.model_dump(exclude_none=True) for t in tools)
    return ToolPlan(fmt, tuple(plain), mode, parallel is not False, definitions)


def history_calls(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Per message, the tool fields the engine needs (``tool_calls`` as ToolCalls, ``tool_call_id``), checked.

    Raises:
        RequestError: see the module docstring.
    """
    open_calls: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        fields: dict[str, Any] = {}
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                try:
                    arguments = json.loads(call.function.arguments)
                except ValueError:
                    arguments = None
                if not isinstance(arguments, dict):
                    raise _bad("arguments must be a JSON object", f"messages.{i}.tool_calls.{j}.function.arguments")
                calls.append(ToolCall(call.function.name, call.function.arguments))
                open_calls.add(call.id)
            fields["tool_calls"] = tuple(calls)
        if m.role == "tool":
            if m.tool_call_id not in open_calls:
                raise _bad("answers no call of an earlier assistant message", f"messages.{i}.tool_call_id")
            fields["tool_call_id"] = m.tool_call_id
        out.append(fields)
    return out


def apply(plan: ToolPlan, turn: TurnRequest, fields: Sequence[dict[str, Any]]) -> TurnRequest:
    """``turn`` with the history's calls and results, rendered for the model's call format, and (when a call may
    come) the grammar that keeps calls valid. With no tools offered, the history's calls are still rendered, so a
    conversation that used tools can go on without them."""
    messages = [{**m, **extra} for m, extra in zip(turn.messages, fields, strict=True)]
    fmt = plan.format
    if not fmt.native and plan.calls_possible:  # the model's earlier answers were {"response": ...}: render them so
        messages = [_as_response(m) for m in messages]
    prompt = fmt.prompt(messages, plan.tools, plan.choice)
    grammar = fmt.grammar(plan.tools, plan.choice, plan.parallel) if plan.calls_possible else None
    params = turn.params if grammar is None else replace(turn.params, grammar=grammar)
    definitions = plan.definitions if fmt.native else None
    return replace(turn, messages=prompt, params=params, tools=definitions)


# The opening of a reply the model wrote in the generic format. A reply cut short (max_tokens) before its JSON closed
# reaches the client as that raw text; it comes back as such and is rendered as written, which is what the model
# wrote and what the cache holds (wrapped in {"response": ...} it missed the cache from its first token on).
CUT_GENERIC_REPLY = re.compile(r'\{\s*"(?:tool_calls|response)"\s*:')


def _as_response(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant's plain answer as the generic format's ``{"response": ...}`` (a cut reply: as written)."""
    if message["role"] != "assistant" or message.get("tool_calls") or not isinstance(message.get("content"), str):
        return message
    if CUT_GENERIC_REPLY.match(message["content"]):
        return message
    answer = json.dumps({"response": message["content"]}, separators=(",", ":"), ensure_ascii=False)
    return {**message, "content": answer}


def read_reply(plan: ToolPlan | None, done: Done) -> tuple[ParsedReply, str]:
    """The reply's text and calls, and its OpenAI finish reason (``tool_calls`` when it made calls)."""
    finish = "length" if done.finish_reason == "length" else "stop"
    if plan is None or not plan.calls_possible:
        return ParsedReply(done.text), finish
    parsed = plan.format.parse(done.text)
    return parsed, ("tool_calls" if parsed.calls else finish)


def settle(engine, turn: TurnRequest, plan: ToolPlan | None, markers, done: Done) -> None:
    """Once a reply that may have called tools is out, compute in the background the history as the next request
    will render it, where that differs from the tokens the model wrote; the next step, with the calls' results, then
    finds its whole history in the cache but the results (instead of ``template_drift`` inside the reply).

    - A family format (the template renders calls itself: other spacing, arguments re-serialized): every reply with
      calls is settled.
    - The generic format renders the reply's JSON as the model wrote it, but not always as the same tokens: a
      constrained reply may spell a word in pieces the tokenizer would not choose (``s`` + ``earch`` where the
      history re-tokenizes ``search``), and a reply's calls or ``{"response": ...}`` answer is re-serialized from
      what was parsed. Such a reply is settled when its re-rendered text or that text's tokens differ from what the
      model produced.

    A reply cut short by ``max_tokens`` is settled too, as the next request renders it (a cut generic reply: as
    written, see ``CUT_GENERIC_REPLY``). The earlier prompt is cached: only the re-rendered reply is computed.
    Nothing is done for replies that failed or were cancelled, or without tools offered. Unmetered, like the
    thinking settle (``reasoning_api.settle``)."""
    if (
        plan is None
        or not plan.calls_possible
        or done.finish_reason not in ("stop", "length")
        or turn.prompt_tokens is not None
    ):
        return
    answer = markers.split(done.text)[1] if markers is not None else done.text
    parsed = plan.format.parse(answer)
    if plan.format.native:
        if not parsed.calls:
            return
        reply = {"role": "assistant", "content": parsed.content or "", "tool_calls": parsed.calls}
        (message,) = plan.format.prompt([reply], plan.tools, plan.choice)
    else:
        if parsed.calls:
            reply = {"role": "assistant", "content": "", "tool_calls": parsed.calls}
        else:
            reply = _as_response({"role": "assistant", "content": parsed.content or ""})
        (message,) = plan.format.prompt([reply], (), ToolChoice("none"))  # the reply alone, as history renders it
        if markers is None and _same_tokens(engine, message["content"], answer, done.token_ids):
            return
    request = replace(turn, messages=[*turn.messages, message], params=SamplingParams(max_tokens=0))
    engine = getattr(engine, "unmetered", engine)
    try:
        engine.submit(request, lambda _event: None)
    except Exception:  # the engine is closing, or the prompt no longer fits: the next step computes it
        _log.debug("could not settle a reply's tool calls", exc_info=True)


def _same_tokens(engine, rendered: str, written: str, token_ids: Sequence[int]) -> bool:
    """Whether the history's text of a reply is the text the model wrote and tokenizes to the tokens it wrote (a
    trailing end-of-sequence token aside). False when that cannot be told."""
    encode = getattr(getattr(engine, "runtime", None), "encode", None)
    if rendered != written or encode is None:
        return False
    tokens = list(encode(rendered))
    return tokens == list(token_ids[: len(tokens)]) and len(token_ids) - len(tokens) in (0, 1)


def wire_calls(calls: Sequence[ToolCall], *, with_index: bool = False) -> list[dict]:
    """OpenAI's ``tool_calls`` (each with a fresh id); ``with_index`` for stream deltas."""
    out = []
    for k, call in enumerate(calls):
        item: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        out.append({"index": k, **item} if with_index else item)
    return out
