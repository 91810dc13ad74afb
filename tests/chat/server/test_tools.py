"""Tool calls over HTTP with real clients: the official SDK's round trip (call -> result -> answer) on the generic
format, streamed calls, tool_choice, LangChain's bind_tools loop, a template that takes tools (tiny-hermes), and
typed refusals of bad tool input that touch nothing."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

CALL = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": PARAMS}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "additionalProperties": False,
            },
        },
    },
]
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


def agent_script(prompt) -> str:
    """A fake model that calls get_weather until it has seen a tool result, then answers."""
    text = bytes(t for t in prompt if t < 256).decode(errors="ignore")
    return '{"response":"It is sunny in Oslo."}' if "sunny" in text else CALL


@pytest.fixture
def agent():
    engine, srv = make_server(runtime=FakeRuntime(script=agent_script))
    with srv:
        yield srv, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused")
    engine.close()


def test_a_tool_round_trip_calls_then_answers_and_the_second_step_hits_the_cache(agent):
    _, client = agent
    messages = list(USER)
    first = client.chat.completions.create(model="fake", messages=messages, tools=TOOLS, max_tokens=200)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = client.chat.completions.create(model="fake", messages=messages, tools=TOOLS, max_tokens=200)
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "It is sunny in Oslo."
    usage = second.usage
    assert usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens >= 0.9


def test_a_reply_cut_inside_the_generic_json_comes_back_as_written_and_the_next_step_hits_it(agent):
    """A generic-format reply cut by max_tokens reaches the client as its raw JSON text; sent back, it is rendered as
    the model wrote it (not wrapped as {"response": ...}), so the next step finds the whole reply in the cache."""
    _, client = agent
    first = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, max_tokens=20)
    choice = first.choices[0]
    assert choice.finish_reason == "length" and choice.message.content == CALL[:20]
    messages = [*USER, {"role": "assistant", "content": choice.message.content}, {"role": "user", "content": "Go on."}]
    second = client.chat.completions.create(model="fake", messages=messages, tools=TOOLS, max_tokens=5)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1, (cached, first.usage)


def test_tool_calls_stream_as_openais_deltas(agent):
    _, client = agent
    chunks = list(client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, max_tokens=200, stream=True))
    calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [(0, "get_weather", '{"city":"Oslo"}')]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].usage is not None


def test_tool_choice_none_gives_text_and_a_named_function_is_called(agent):
    _, client = agent
    text = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice="none", max_tokens=200)
    assert text.choices[0].finish_reason == "stop" and text.choices[0].message.tool_calls is None
    forced = client.chat.completions.create(
        model="fake",
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=200,
        temperature=0,
    )
    (call,) = forced.choices[0].message.tool_calls
    assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments), dict)


def test_langchain_bind_tools_runs_a_two_step_loop(agent):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    srv, _ = agent
    model = ChatOpenAI(base_url=f"{srv.url}/v1", api_key="unused", model="fake", max_tokens=200).bind_tools(TOOLS)
    history = [HumanMessage("What is the weather in Oslo?")]
    step = model.invoke(history)
    assert step.tool_calls[0]["name"] == "get_weather" and step.tool_calls[0]["args"] == {"city": "Oslo"}
    history += [step, ToolMessage("sunny", tool_call_id=step.tool_calls[0]["id"])]
    assert model.invoke(history).content == "It is sunny in Oslo."


def test_a_template_that_takes_tools_gets_them_and_required_calls_are_valid():
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = load_model("tiny-hermes")  # random weights: only the grammar makes its calls valid
    engine = Engine(runtime, cache=PrefixCache())
    with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused")
        for seed in range(3):
            reply = client.chat.completions.create(
                model=runtime.name,
                messages=USER,
                tools=TOOLS[:1],
                tool_choice="required",
                temperature=1.0,
                seed=seed,
                max_tokens=400,
            )
            choice = reply.choices[0]
            if choice.finish_reason == "length":
                continue
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), PARAMS)
        auto = client.chat.completions.create(
            model=runtime.name, messages=USER, tools=TOOLS, max_tokens=8, temperature=0
        )
        assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")  # free text, read back
    engine.close()


def _post(url, body):
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": USER, **body}, timeout=30)


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    ],
}


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "invalid_grammar",
            "tools[0].function.parameters",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "invalid_request",
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "invalid_request", "tool_choice"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "invalid_request", "tools"),
        (
            {"messages": [*USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "invalid_request",
            "messages.1.tool_call_id",
        ),
        (
            {"messages": [*USER, CALLED, {"role": "tool", "tool_call_id": "call_2", "content": "x"}]},
            "invalid_request",
            "messages.2.tool_call_id",
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        **CALLED,
                        "tool_calls": [{**CALLED["tool_calls"][0], "function": {"name": "f", "arguments": "[1]"}}],
                    },
                ]
            },
            "invalid_request",
            "messages.1.tool_calls.0.function.arguments",
        ),
        ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "invalid_request", "messages.1"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "unsupported_parameter", "response_format"),
    ],
)
def test_bad_tool_input_is_refused_by_name_before_anything_runs(body, code, param):
    engine, srv = make_server()
    with srv:
        r = _post(srv.url, body)
        error = r.json()["error"]
        assert (r.status_code, error["code"], error["param"]) == (400, code, param), r.text
        assert engine.runtime.forwarded == 0
    engine.close()


def test_a_conversation_that_used_tools_goes_on_without_them(agent):
    srv, _ = agent
    messages = [
        *USER,
        CALLED,
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    r = _post(srv.url, {"messages": messages, "max_tokens": 50})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_template_that_re_renders_calls_is_settled_so_the_next_http_step_hits_the_whole_history():
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings
    from chat.server.surfaces.openai_api import ChatCompletionRequest, build_turn

    runtime = load_model("tiny-hermes")
    engine = Engine(runtime, cache=PrefixCache())
    zone = TOOLS[1]
    with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused")
        ask = {"model": runtime.name, "tools": [zone], "temperature": 0, "max_tokens": 400}
        first = client.chat.completions.create(messages=USER, tool_choice="required", **ask)
        assert first.choices[0].finish_reason == "tool_calls"
        (call,) = first.choices[0].message.tool_calls
        messages = [
            *USER,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
        ]
        second = client.chat.completions.create(messages=messages, tool_choice="none", **ask)
    engine.close()
    request = ChatCompletionRequest.model_validate({**ask, "messages": messages})
    turn, _, _ = build_turn(request, "", runtime)
    step = runtime.render_prompt(turn.messages, turn.tools).tokens
    ahead = runtime.render_prompt(turn.messages[:-1], turn.tools).tokens
    shared = next((i for i, (a, b) in enumerate(zip(step, ahead, strict=False)) if a != b), len(ahead))
    details = second.usage.prompt_tokens_details
    assert second.usage.prompt_tokens == len(step) and details.cached_tokens == shared, second.usage
    assert len(ahead) - shared <= 8
