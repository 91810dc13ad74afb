"""Tool-call formats: each family's syntax read back (and malformed calls left as text), the grammars that keep
constrained calls valid, the generic format's prompt, and which format a chat template gets."""

from __future__ import annotations

import json

import jsonschema
import pytest

from chat.engine.constraints import GrammarCompiler
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.tool_calls import FORMATS, Tool, ToolCall, ToolChoice, format_of
from chat.engine.turn import Turn, run_to_end
from chat.models.tiny.templates import HERMES_TOOLS
from tests.chat.engine.fakes import FakeRuntime

WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
TIME = Tool(
    "get_time",
    "",
    {
        "type": "object",
        "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
)


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        ("generic", '{"tool_calls":[{"name":"f","arguments":{"a":1}}]}', None, [("f", '{"a":1}')]),
        ("generic", '{"response":"hi there"}', "hi there", []),
        ("generic", "plain words", "plain words", []),
        (
            "generic",
            '{"tool_calls":[{"name":"f","arguments":[1]}]}',
            '{"tool_calls":[{"name":"f","arguments":[1]}]}',
            [],
        ),
        (
            "hermes",
            'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
            "Sure.",
            [("f", '{"a":1}')],
        ),
        (
            "hermes",
            '<tool_call>{"name":"f","arguments":{}}</tool_call>\n<tool_call>{"name":"g","arguments":{"b":"x"}}</tool_call>',
            None,
            [("f", "{}"), ("g", '{"b":"x"}')],
        ),
        ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
        ("llama3", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}', None, [("f", '{"a":1}')]),
        ("llama3", "The answer is 4.", "The answer is 4.", []),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]', None, [("f", '{"a":1}')]),
        ("mistral", "[TOOL_CALLS] nope", "[TOOL_CALLS] nope", []),
    ],
)
def test_each_format_reads_its_calls_and_leaves_malformed_ones_as_text(fmt, text, content, calls):
    parsed = FORMATS[fmt].parse(text)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == calls


def test_the_format_follows_the_chat_template():
    assert format_of(HERMES_TOOLS) == "hermes"
    assert format_of("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"
    assert format_of("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]") == "mistral"
    assert format_of(None) == "generic"


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(FakeRuntime().constraint_tokenizer())


@pytest.mark.parametrize("fmt", ["generic", "hermes", "llama3", "mistral"])
@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("named", "get_time")])
def test_required_calls_compile_for_every_format(compiler, fmt, choice):
    spec = FORMATS[fmt].grammar([WEATHER, TIME], choice, True)
    assert spec is not None
    compiler.compile(spec)


def test_auto_and_none_leave_family_formats_free(compiler):
    assert FORMATS["hermes"].grammar([WEATHER], ToolChoice("auto"), True) is None
    assert FORMATS["generic"].grammar([WEATHER], ToolChoice("none"), True) is None
    assert FORMATS["generic"].grammar([WEATHER], ToolChoice("auto"), True) is not None  # text or calls, as JSON


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("fmt", "choice"), [("generic", ToolChoice("auto")), ("hermes", ToolChoice("required"))])
def test_a_constrained_call_is_always_valid_for_its_schema(compiler, fmt, choice, seed):
    """The fake model talks nonsense ("reply N ünï"); sampled at temperature 1, every finished reply is still a
    valid answer or valid calls."""
    spec = FORMATS[fmt].grammar([WEATHER, TIME], choice, True)
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=300, grammar=spec)
    turn = Turn(
        FakeRuntime(), None, TurnRequest([{"role": "user", "content": "hi"}], params), grammar=compiler.compile(spec)
    )
    done = run_to_end(turn)[1]
    assert done.finish_reason == "stop", done.text
    parsed = FORMATS[fmt].parse(done.text)
    schemas = {t.name: t.parameters for t in (WEATHER, TIME)}
    for call in parsed.calls:
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    assert parsed.calls or (fmt == "generic" and parsed.content is not None)


def test_the_generic_prompt_describes_the_tools_and_writes_calls_as_the_model_did():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": (ToolCall("get_weather", '{"city":"Oslo"}'),)},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    out = FORMATS["generic"].prompt(messages, [WEATHER], ToolChoice("auto"))
    assert out[0]["content"].startswith("Be brief.\n\nYou can call tools.") and "get_weather" in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}',
    }
    assert out[3] == {"role": "tool", "content": "sunny"}
    plain = FORMATS["generic"].prompt(messages, [WEATHER], ToolChoice("none"))
    assert plain[0] == {"role": "system", "content": "Be brief."}  # nothing offered: nothing described
