"""Tool calls: how a model is told about tools, how its calls are constrained, and how they are read back from its
reply, per call syntax, as data in one table (:data:`FORMATS`).

A model whose chat template takes ``tools`` writes calls in its family's own syntax; the template renders the tools
and the history's calls itself. A template without tool support gets the **generic** format (as llama.cpp does): the
tools are described in the system message and every reply is one JSON object, either ``{"tool_calls": [{"name",
"arguments"}, ...]}`` or ``{"response": "..."}``, constrained by a grammar built from the tools' schemas, so a call is
always valid for its schema. Family formats constrain the reply when a call is required (``tool_choice`` "required" or
a named function): the reply is then one or more calls in the family's syntax, each valid for its schema; with "auto"
the reply is free and its calls are parsed (a malformed one stays text).

    fmt = FORMATS[runtime.tool_format]
    messages = fmt.prompt(messages, tools, choice)             # generic: tools in the system message, calls as JSON
    spec = fmt.grammar(tools, choice, parallel)                # or None: free text
    reply = fmt.parse(text)                                     # ParsedReply(content, calls)

Tools and calls here are plain data (:class:`Tool`, :class:`ToolCall`); the wire types are ``chat.protocol.tools``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chat.engine.constraints import JSON_OPTIONS, GrammarSpec, canonical_json

MAX_PARALLEL_CALLS = 16  # calls one constrained reply may make (a model that never stops calling is cut here)


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})  # JSON schema of the arguments
    strict: bool = False  # refuse schema keywords the decoder cannot enforce


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto`` (text or calls), ``none`` (text), ``required`` (calls), or one named function (``name``)."""

    mode: str = "auto"  # "auto" | "none" | "required" | "named"
    name: str | None = None  # the function, when mode is "named"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object, as the model wrote it (compact)


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str | None  # the text of the reply besides its calls (None when there is none)
    calls: tuple[ToolCall, ...] = ()


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _offered(tools: Sequence[Tool], choice: ToolChoice) -> list[Tool]:
    return [t for t in tools if t.name == choice.name] if choice.mode == "named" else list(tools)


def _call_schema(tool: Tool, arguments_key: str = "arguments") -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: tool.parameters or {"type": "object"}},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _any_call(tools: Sequence[Tool], arguments_key: str = "arguments") -> dict:
    schemas = [_call_schema(t, arguments_key) for t in tools]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _call_array(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> dict[str, Any]:
    """A JSON array of 1 .. MAX_PARALLEL_CALLS calls (one for a named function or without parallel calls)."""
    most = MAX_PARALLEL_CALLS if parallel and choice.mode != "named" else 1
    return {"type": "array", "items": _any_call(_offered(tools, choice)), "minItems": 1, "maxItems": most}


def _strict(tools: Sequence[Tool]) -> bool:
    return all(t.strict for t in tools)


# ---------------------------------------------------------------- generic (templates without tools)

GENERIC_INSTRUCTIONS = (
    "You can call tools. Reply with exactly one JSON object: "
    '{"tool_calls": [{"name": <tool name>, "arguments": <arguments object>}]} to call tools, or '
    '{"response": "<your answer>"} to answer directly. The tools:'
)


def _generic_prompt(messages: Sequence[dict], tools: Sequence[Tool], choice: ToolChoice) -> list[dict]:
    """Tools in the system message (unless ``none``); the history's calls as the JSON the model wrote; tool
    results as ``tool`` messages; the assistant's plain answers as ``{"response": ...}`` only where the model wrote
    them that way (text the client wrote itself is kept as text)."""
    out: list[dict] = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            body = ",".join(
                f'{{"name":{json.dumps(c.name, ensure_ascii=False)},"arguments":{c.arguments}}}' for c in calls
            )
            out.append({"role": "assistant", "content": f'{{"tool_calls":[{body}]}}'})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content")})
    if choice.mode == "none" or not tools:
        return out
    lines = [GENERIC_INSTRUCTIONS]
    for t in tools:
        lines.append(f"- {t.name}: {t.description} Arguments (JSON schema): {_compact(t.parameters)}")
    described = "\n".join(lines)
    if out and out[0]["role"] == "system" and isinstance(out[0]["content"], str):
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
    else:
        out.insert(0, {"role": "system", "content": described})
    return out


def _generic_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> GrammarSpec | None:
    if choice.mode == "none" or not tools:
        return None
    calls = {
        "type": "object",
        "properties": {"tool_calls": _call_array(tools, choice, parallel)},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    answer = {
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    schema = calls if choice.mode in ("required", "named") else {"anyOf": [calls, answer]}
    return GrammarSpec("json_schema", canonical_json(schema), strict=_strict(tools))


def _generic_parse(text: str) -> ParsedReply:
    try:
        value = json.loads(text)
    except ValueError:
        return ParsedReply(text)
    if isinstance(value, dict) and isinstance(value.get("response"), str) and len(value) == 1:
        return ParsedReply(value["response"])
    calls = value.get("tool_calls") if isinstance(value, dict) else None
    parsed = _calls(calls, "arguments")
    return ParsedReply(None, parsed) if parsed else ParsedReply(text)


def _calls(items: Any, arguments_key: str) -> tuple[ToolCall, ...]:
    """Calls from a list of ``{"name", arguments_key}`` objects; () if anything is malformed."""
    if not isinstance(items, list) or not items:
        return ()
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return ()
        arguments = item.get(arguments_key, {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return ()
        if not isinstance(arguments, dict):
            return ()
        out.append(ToolCall(item["name"], _compact(arguments)))
    return tuple(out)


# ---------------------------------------------------------------- family formats (templates that take tools)

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _hermes_parse(text: str) -> ParsedReply:
    blocks = _HERMES_CALL.findall(text)
    if not blocks:
        return ParsedReply(text)
    items = []
    for block in blocks:
        try:
            items.append(json.loads(block))
        except ValueError:
            return ParsedReply(text)
    calls = _calls(items, "arguments")
    if not calls:
        return ParsedReply(text)
    rest = _HERMES_CALL.sub("", text).strip()
    return ParsedReply(rest or None, calls)


def _embedded(schema: dict) -> str:
    """A schema for a Lark grammar's ``%json``: written compactly, as a schema by itself is (JSON_OPTIONS)."""
    return canonical_json({**schema, "x-guidance": JSON_OPTIONS})


def _hermes_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> GrammarSpec | None:
    if choice.mode not in ("required", "named") or not tools:
        return None
    body = _embedded(_any_call(_offered(tools, choice)))
    repeat = f'("\\n" call)~0..{MAX_PARALLEL_CALLS - 1}' if parallel and choice.mode != "named" else ""
    lark = f'start: call {repeat}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: %json {body}\n'
    return GrammarSpec("grammar", lark)


def _llama3_parse(text: str) -> ParsedReply:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedReply(text)
    items = []
    for part in body.split(";"):  # Llama 3.1 separates parallel calls with ';'
        try:
            items.append(json.loads(part))
        except ValueError:
            return ParsedReply(text)
    calls = _calls(items, "parameters")
    return ParsedReply(None, calls) if calls else ParsedReply(text)


def _llama3_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> GrammarSpec | None:
    if choice.mode not in ("required", "named") or not tools:
        return None
    return GrammarSpec("json_schema", canonical_json(_any_call(_offered(tools, choice), "parameters")), _strict(tools))


def _mistral_parse(text: str) -> ParsedReply:
    head, marker, body = text.partition("[TOOL_CALLS]")
    if not marker:
        return ParsedReply(text)
    try:
        items = json.loads(body.strip())
    except ValueError:
        return ParsedReply(text)
    calls = _calls(items if isinstance(items, list) else [items], "arguments")
    return ParsedReply(head.strip() or None, calls) if calls else ParsedReply(text)


def _mistral_grammar(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> GrammarSpec | None:
    if choice.mode not in ("required", "named") or not tools:
        return None
    array = _call_array(tools, choice, parallel)
    return GrammarSpec("grammar", f'start: "[TOOL_CALLS]" body\nbody: %json {_embedded(array)}\n')


def _native_prompt(messages: Sequence[dict], tools: Sequence[Tool], choice: ToolChoice) -> list[dict]:
    """The messages for a template that renders tools itself: calls as the template reads them (arguments as
    objects), tool results as ``tool`` messages."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            rendered = [
                {"type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls
            ]
            out.append({"role": "assistant", "content": m.get("content") or "", "tool_calls": rendered})
        else:
            out.append(dict(m))
    return out


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """One call syntax."""

    name: str
    marker: str | None  # text whose presence in a chat template selects this format (None: the fallback)
    native: bool  # the template renders the tools (passed to it as ``tools``) and the history's calls
    prompt: Callable[[Sequence[dict], Sequence[Tool], ToolChoice], list[dict]]
    grammar: Callable[[Sequence[Tool], ToolChoice, bool], GrammarSpec | None]
    parse: Callable[[str], ParsedReply]


FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        ToolFormat("hermes", "<tool_call>", True, _native_prompt, _hermes_grammar, _hermes_parse),  # Qwen, Hermes
        ToolFormat("mistral", "[TOOL_CALLS]", True, _native_prompt, _mistral_grammar, _mistral_parse),
        ToolFormat("llama3", "<|python_tag|>", True, _native_prompt, _llama3_grammar, _llama3_parse),
        ToolFormat("generic", None, False, _generic_prompt, _generic_grammar, _generic_parse),
    )
}


def format_of(chat_template: str | None) -> str:
    """The format a chat template calls tools in: the first of :data:`FORMATS` whose marker it holds, if it takes
    ``tools`` at all; else ``generic``."""
    text = chat_template or ""
    if "tools" in text:
        for f in FORMATS.values():
            if f.marker is not None and f.marker in text:
                return f.name
    return "generic"
