"""Tools over the chat WebSocket: a session turn offers tools, its reply's calls come as reply.tool_call events and
reply.done's tool_calls, tool.results answer them and join the conversation, the next turn finds its whole history in
the cache but the results; bad tool input is refused by name and leaves the session usable; tool loops inside
batches give the tokens they give alone and without the cache, with log-probabilities within 1e-4 (float32) or bit
for bit (int8, native kernels)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import jsonschema
import pytest
from websockets.asyncio.client import connect

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.engine.scheduler import BatchSettings
from chat.server.app import create_app
from chat.server.runner import BackgroundServer
from chat.server.settings import ServerSettings
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, run, ws_url
from tests.chat.server.test_tools import TOOLS, agent_script


@pytest.fixture
def agent():
    engine, srv = make_server(runtime=FakeRuntime(script=agent_script))
    with srv:
        yield srv
    engine.close()


async def _until_done(c: Client) -> tuple[dict, list[dict]]:
    return await c.until("reply.done")


def _cached(done: dict) -> int:
    return done["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_tool_round_trip_over_the_socket_hits_the_cache_for_the_whole_history(agent):
    async def scenario():
        async with connect(ws_url(agent)) as ws:
            c = Client(ws)
            await c.send(type="session.create", system="be brief")
            await c.until("session.created")
            await c.send(type="turn.create", content="What is the weather in Oslo?", tools=TOOLS, event_id="t1")
            first, seen = await _until_done(c)
            calls = [e for e in seen if e["type"] == "reply.tool_call"]
            assert not [e for e in seen if e["type"] == "reply.delta"]  # the call's JSON is not sent as text
            assert first["finish_reason"] == "tool_calls" and first["text"] == "" and first["message_id"]
            assert [e["call"] for e in calls] == first["tool_calls"] and calls[0]["index"] == 0
            call = first["tool_calls"][0]
            assert call["function"]["name"] == "get_weather"
            assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
            results = [{"tool_call_id": call["id"], "content": "sunny"}]
            await c.send(type="tool.results", results=results, tools=TOOLS, event_id="r1")
            started, _ = await c.until("turn.started")
            second, seen = await _until_done(c)
            await c.send(type="conversation.get")
            conversation, _ = await c.until("conversation")
            return first, started, second, seen, conversation

    first, started, second, seen, conversation = run(scenario())
    assert started["kind"] == "tool_results"
    assert second["finish_reason"] == "stop" and second["text"] == "It is sunny in Oslo."
    assert "".join(e["delta"] for e in seen if e["type"] == "reply.delta") == second["text"]
    # everything but the tool message came from the cache: the first prompt and every token the first reply
    # generated but its last (the end-of-turn token, sampled and never fed to the model: the next turn computes it)
    assert _cached(second) == first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
    assert second["usage"]["prompt_tokens_details"]["cache_miss_reason"] == "end_of_cache"
    messages = conversation["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"] == first["tool_calls"] and messages[1]["finish_reason"] == "tool_calls"
    assert messages[2]["tool_call_id"] == first["tool_calls"][0]["id"] and messages[2]["content"] == "sunny"


def test_without_tools_a_session_turn_streams_as_before(agent):
    async def scenario():
        async with connect(ws_url(agent)) as ws:
            c = Client(ws)
            await c.send(type="session.create")
            await c.until("session.created")
            return await c.turn("What is the weather in Oslo?")

    done = run(scenario())
    assert done["finish_reason"] == "stop" and done["text"].startswith('{"tool_calls"') and "tool_calls" not in done


BAD = [
    (
        {
            "type": "turn.create",
            "content": "x",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
        },
        "invalid_grammar",
        "tools[0].function.parameters:",
    ),
    (
        {
            "type": "turn.create",
            "content": "x",
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        "invalid_event",
        "tool_choice:",
    ),
    ({"type": "turn.create", "content": "x", "tool_choice": "required"}, "invalid_event", "tool_choice:"),
    (
        {"type": "tool.results", "results": [{"tool_call_id": "call_9", "content": "x"}]},
        "invalid_event",
        "results.0.tool_call_id:",
    ),
]


@pytest.mark.parametrize(("event", "code", "field"), BAD, ids=["schema", "named", "choice_without_tools", "no_call"])
def test_bad_tool_input_is_refused_by_name_and_the_session_stays_usable(agent, event, code, field):
    async def scenario():
        async with connect(ws_url(agent)) as ws:
            c = Client(ws)
            await c.send(type="session.create")
            await c.until("session.created")
            await c.send(**event, event_id="bad")
            error = await c.recv()
            done = await c.turn("hello")  # no turn.started came for the refused event: this turn is the next one
            await c.send(type="conversation.get")
            conversation, _ = await c.until("conversation")
            return error, done, conversation

    error, done, conversation = run(scenario())
    assert error["type"] == "error" and error["code"] == code and error["reply_to"] == "bad"
    assert error["message"].startswith(field)
    assert done["finish_reason"] == "stop"
    assert [m["role"] for m in conversation["messages"]] == ["user", "assistant"]


def test_a_result_for_an_unknown_call_after_a_real_call_is_refused_and_the_right_one_then_works(agent):
    async def scenario():
        async with connect(ws_url(agent)) as ws:
            c = Client(ws)
            await c.send(type="session.create")
            await c.until("session.created")
            await c.send(type="turn.create", content="What is the weather in Oslo?", tools=TOOLS)
            first, _ = await _until_done(c)
            await c.send(type="tool.results", results=[{"tool_call_id": "call_nope", "content": "x"}], event_id="r0")
            error = await c.recv()
            results = [{"tool_call_id": first["tool_calls"][0]["id"], "content": "sunny"}]
            await c.send(type="tool.results", results=results, tools=TOOLS)
            second, _ = await _until_done(c)
            return error, second

    error, second = run(scenario())
    assert error["code"] == "invalid_event" and error["message"].startswith("results.0.tool_call_id:")
    assert second["text"] == "It is sunny in Oslo."


# ---------------------------------------------------------------- stateless tool loops (completion.create)


def test_a_stateless_tool_round_trip_over_the_socket_hits_the_cache_for_the_whole_history(agent):
    """completion.create offers tools as turn.create does; the client keeps the conversation (the call, its result)
    and sends it whole, and the reply after the result finds everything but the result in the cache."""
    question = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is the weather in Oslo?"}]

    async def scenario():
        async with connect(ws_url(agent)) as ws:
            c = Client(ws)
            await c.send(type="completion.create", messages=question, tools=TOOLS, event_id="x1")
            first, seen = await _until_done(c)
            calls = [e["call"] for e in seen if e["type"] == "reply.tool_call"]
            call = first["tool_calls"][0]
            history = [
                *question,
                {"role": "assistant", "content": "", "tool_calls": first["tool_calls"]},
                {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
            ]
            await c.send(type="completion.create", messages=history, tools=TOOLS, event_id="x2")
            second, _ = await _until_done(c)
            return first, calls, second

    first, calls, second = run(scenario())
    assert first["finish_reason"] == "tool_calls" and "message_id" not in first and first["reply_to"] == "x1"
    assert calls == first["tool_calls"] and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert second["finish_reason"] == "stop" and second["text"] == "It is sunny in Oslo."
    assert _cached(second) == first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1


STATELESS_BAD = [
    (
        [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "y"}],
        {},
        "tool_call_id",
    ),
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}], {}, "tool_call_id"),
    ([{"role": "user", "content": "x", "tool_calls": []}, {"role": "assistant", "content": "y"}], {}, "last message"),
    ([{"role": "user", "content": "x"}], {"tool_choice": "required"}, "tool_choice:"),
    (
        [{"role": "user", "content": "x"}],
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
        "tools[0].function.parameters:",
    ),
]


@pytest.mark.parametrize(
    ("messages", "extra", "text"), STATELESS_BAD, ids=["no_call", "no_call_id", "ends_assistant", "choice", "schema"]
)
def test_bad_stateless_tool_input_is_refused_before_the_turn_starts(agent, messages, extra, text):
    async def scenario():
        async with connect(ws_url(agent)) as ws:
            c = Client(ws)
            await c.send(type="completion.create", messages=messages, **extra, event_id="bad")
            error = await c.recv()
            await c.send(type="completion.create", messages=[{"role": "user", "content": "hello"}])
            started, _ = await c.until("turn.started")  # the refused event started nothing: this turn is the next
            done, _ = await _until_done(c)
            return error, started, done

    error, started, done = run(scenario())
    assert error["type"] == "error" and error["reply_to"] == "bad" and text in error["message"], error
    assert error["code"] in ("invalid_event", "invalid_grammar")
    assert started.get("reply_to") is None and done["finish_reason"] == "stop"


# ---------------------------------------------------------------- exactness inside batches

ZONE = TOOLS[1]  # get_time(zone: "UTC" | "CET"): a call of a few tokens, whatever the weights


async def _loop(url: str, question: str) -> list[list[tuple[int, float]]]:
    """One agent loop over the socket: a required call, its result, another required call, its result, an answer;
    greedy. Returns each reply's tokens with their log-probabilities."""
    sampling = {"temperature": 0, "logprobs": True}
    tokens: list[list[tuple[int, float]]] = []
    async with connect(url) as ws:
        c = Client(ws)
        await c.send(type="session.create", system="You tell the time.", sampling=sampling)
        await c.until("session.created")
        steps = [
            {"type": "turn.create", "content": question, "tool_choice": "required"},
            {"type": "tool.results", "tool_choice": "required"},
            {"type": "tool.results", "tool_choice": "none"},
        ]
        calls: list[dict] = []
        for k, step in enumerate(steps):
            if step["type"] == "tool.results":
                step = {**step, "results": [{"tool_call_id": x["id"], "content": f"12:0{k}"} for x in calls]}
            await c.send(**step, tools=[ZONE], parallel_tool_calls=False, sampling={"max_tokens": 96 if k < 2 else 24})
            done, seen = await c.until("reply.done")
            assert done["finish_reason"] in ("tool_calls", "stop", "length"), done
            deltas = [e for e in seen if e["type"] == "reply.delta"]
            ids = [t for e in deltas for t in e.get("token_ids") or ()]
            logprobs = [x["logprob"] for e in deltas for x in e.get("logprobs") or ()]
            tokens.append(list(zip(ids, logprobs, strict=False)))
            calls = done.get("tool_calls") or []
            if k < 2:
                assert done["finish_reason"] == "tool_calls", done  # required: a call, valid for its schema
                (call,) = calls
                jsonschema.validate(json.loads(call["function"]["arguments"]), ZONE["function"]["parameters"])
    return tokens


def _serve(runtime, cache: bool):
    engine = Engine(runtime, cache=PrefixCache() if cache else None, batch=BatchSettings(max_batch=3, token_budget=24))
    return engine, BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name))


def _same(a: list, b: list, tolerance: float) -> None:
    """Per loop and step: the same tokens, log-probabilities within ``tolerance`` (0: bit for bit)."""
    for loop_a, loop_b in zip(a, b, strict=True):
        for step_a, step_b in zip(loop_a, loop_b, strict=True):
            assert [t for t, _ in step_a] == [t for t, _ in step_b]
            assert max((abs(x - y) for (_, x), (_, y) in zip(step_a, step_b, strict=True)), default=0.0) <= tolerance


@pytest.mark.parametrize(("weights", "tolerance"), [("int8", 0.0), ("float32", 1e-4)])
def test_tool_loops_in_a_batch_give_the_tokens_they_give_alone_and_without_the_cache(weights, tolerance):
    from chat.models import load_model

    runtime = load_model("tiny-llama", weights=weights)
    questions = ["What time is it in Oslo?", "Time in Paris, please.", "And in Rome?"]
    engine, srv = _serve(runtime, cache=True)
    with srv:

        async def together():
            return await asyncio.gather(*(_loop(ws_url(srv), q) for q in questions))

        batched = run(together())
        again = run(together())  # every history now cached up to its last reply
        shared = engine.metrics.step_turns > engine.metrics.steps  # some forwards held several turns
    engine.close()
    assert shared
    engine, srv = _serve(runtime, cache=False)
    with srv:
        alone = [run(_loop(ws_url(srv), q)) for q in questions]
    engine.close()
    assert all(step for loop in alone for step in loop)  # every reply has tokens with log-probabilities
    _same(batched, alone, tolerance)
    _same(again, alone, tolerance)


def test_a_template_that_re_renders_calls_is_settled_so_the_next_step_hits_the_whole_history():
    """tiny-hermes renders the history's calls its own way (not as the model wrote them): once a reply with calls is
    out, the server computes the history as the template renders it, so the step after the results finds all of it
    in the cache but the results (without the settle, reuse stops inside the call: template_drift)."""
    from chat.models import load_model
    from chat.server.surfaces.ws import build_turn

    runtime = load_model("tiny-hermes")
    engine, srv = _serve(runtime, cache=True)
    sampling = {"temperature": 0, "max_tokens": 400}
    with srv:

        async def scenario():
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.send(type="session.create", sampling=sampling)
                await c.until("session.created")
                await c.send(type="turn.create", content="Time in Oslo?", tools=[ZONE], tool_choice="required")
                first, _ = await c.until("reply.done")
                assert first["finish_reason"] == "tool_calls", first
                results = [{"tool_call_id": first["tool_calls"][0]["id"], "content": "12:00"}]
                await c.send(type="tool.results", results=results, tools=[ZONE], tool_choice="none")
                second, _ = await c.until("reply.done")
                await c.send(type="conversation.get")
                conversation, _ = await c.until("conversation")
                return second, conversation

        second, conversation = run(scenario())
    engine.close()
    # the prompts as the template renders them: up to the reply with its call (then a generation prompt), and the
    # second step's (the call's result after it); what they share is the whole history but the result
    from chat.protocol.content import ConversationMessage
    from chat.protocol.sampling import SamplingSettings
    from chat.protocol.session import TurnPlan, render
    from chat.protocol.tools import ToolDef

    history = [ConversationMessage.model_validate(m) for m in conversation["messages"][:3]]  # user, call, result
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    plan = TurnPlan("t", "create", render(None, history), SamplingSettings(), runtime.name, "s", None, None)
    plan = dataclasses.replace(plan, tools=(ToolDef.model_validate(ZONE),), tool_choice="none")
    request, _ = build_turn(plan, "", runtime)
    step = runtime.render_prompt(request.messages, request.tools).tokens
    ahead = runtime.render_prompt(request.messages[:-1], request.tools).tokens
    shared = next((i for i, (a, b) in enumerate(zip(step, ahead, strict=False)) if a != b), min(len(step), len(ahead)))
    usage = second["usage"]
    assert usage["prompt_tokens"] == len(step)
    assert usage["prompt_tokens_details"]["cached_tokens"] == shared, usage
    assert len(ahead) - shared <= 8  # all of the history ahead but its generation prompt's tokens
