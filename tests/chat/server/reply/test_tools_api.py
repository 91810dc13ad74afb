"""Tools in chat completions (``chat/server/reply/tools_api.py``): the request's tools and history checked by name,
the reply read back as OpenAI's calls, and the settle of a reply whose history would be other tokens. (Over HTTP
with real clients: tests/chat/server/test_tools.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from chat.engine.events import Done, Timings, Usage
from chat.protocol.errors import ErrorCode
from chat.protocol.tools import NamedToolChoice, ToolDef
from chat.server.errors import RequestError
from chat.server.reply import tools_api
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.test_tools import CALL, TOOLS, USER


class _Recorder:
    """An engine that records what is submitted to it (the settle's background turns)."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.submitted = []

    def submit(self, request, sink) -> None:
        self.submitted.append(request)


def _generic_settle(text: str, token_ids, finish: str = "stop") -> tuple[list, list]:
    """What the settle submits after a generic-format reply ``text`` written as ``token_ids``, and the turn's
    messages."""
    from chat.engine.events import Done, Timings, TurnRequest, Usage
    from chat.protocol.tools import ToolDef
    from chat.server.reply import tools_api

    runtime = FakeRuntime()
    plan = tools_api.plan_tools([ToolDef.model_validate(t) for t in TOOLS], "auto", None, runtime)
    turn = tools_api.apply(plan, TurnRequest(messages=list(USER)), [{} for _ in USER])
    done = Done(text, tuple(token_ids), finish, Usage(10, 0, len(token_ids)), Timings(1.0, 1.0, 1.0, 2.0))
    engine = _Recorder(runtime)
    tools_api.settle(engine, turn, plan, None, done)
    return engine.submitted, list(turn.messages)


@pytest.mark.parametrize(
    ("text", "tokens", "settled"),
    [
        (CALL, list(CALL.encode()), False),  # as the history re-tokenizes it: nothing to compute ahead
        (CALL, [*CALL.encode(), 0], False),  # an end-of-sequence token after it changes nothing
        (CALL, [*CALL.encode()[:20], 999, *CALL.encode()[21:]], True),  # one piece the tokenizer would not choose
        (CALL.replace(":", ": "), list(CALL.replace(":", ": ").encode()), True),  # the history re-serializes it
        ('{"response":"Sunny."}', list(b'{"response":"Sunny."}'), False),
        ('{"response": "Sunny."}', list(b'{"response": "Sunny."}'), True),
    ],
)
def test_a_generic_reply_is_settled_when_the_history_would_render_other_tokens(text, tokens, settled):
    """A generic-format reply whose history would be other tokens than the model wrote (a constrained reply may
    spell a word in pieces the tokenizer would not choose; calls and answers are re-serialized) is computed ahead
    as the next step renders it; one that re-renders to the same tokens costs nothing."""
    submitted, messages = _generic_settle(text, tokens)
    assert bool(submitted) is settled
    if settled:
        (request,) = submitted
        rendered = json.dumps(json.loads(text), separators=(",", ":"))
        assert request.messages == [*messages, {"role": "assistant", "content": rendered}]
        assert request.params.max_tokens == 0


@pytest.mark.parametrize(("tokens", "settled"), [(list(CALL[:20].encode()), False), ([*CALL.encode()[:5], 999], True)])
def test_a_cut_generic_reply_is_settled_as_written_when_its_tokens_differ(tokens, settled):
    """A reply cut by max_tokens inside the generic JSON comes back as written (see the HTTP test above): it is
    computed ahead as such when the model wrote it in other tokens than the history's, and costs nothing else."""
    submitted, _ = _generic_settle(CALL[:20], tokens, finish="length")
    assert bool(submitted) is settled
    if settled:
        (request,) = submitted
        assert request.messages[-1] == {"role": "assistant", "content": CALL[:20]}


def plan(tools=TOOLS, choice="auto", parallel=None):
    defs = [ToolDef.model_validate(t) for t in tools] if tools is not None else None
    return tools_api.plan_tools(defs, choice, parallel, FakeRuntime())


def test_a_plan_offers_the_tools_with_the_choice_and_parallel_calls_unless_turned_off():
    offered = plan()
    assert [t.name for t in offered.tools] == ["get_weather", "get_time"] and offered.calls_possible
    assert offered.parallel and not plan(parallel=False).parallel
    named = plan(choice=NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}}))
    assert (named.choice.mode, named.choice.name) == ("named", "get_time")
    assert not plan(choice="none").calls_possible
    assert plan(tools=None, choice="none").tools == () and not plan(tools=None).calls_possible


@pytest.mark.parametrize(
    ("tools", "choice", "param", "code"),
    [
        (None, "required", "tool_choice", ErrorCode.INVALID_REQUEST),  # a choice without tools
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice", ErrorCode.INVALID_REQUEST),
        ([TOOLS[0], TOOLS[0]], "auto", "tools", ErrorCode.INVALID_REQUEST),  # two functions of one name
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
            "auto",
            "tools[0].function.parameters",
            ErrorCode.INVALID_GRAMMAR,
        ),
    ],
)
def test_bad_tools_are_refused_naming_the_field(tools, choice, param, code):
    if isinstance(choice, dict):
        choice = NamedToolChoice.model_validate(choice)
    with pytest.raises(RequestError) as info:
        plan(tools, choice)
    assert (info.value.code, info.value.param) == (code, param)


def message(role, **fields):
    return SimpleNamespace(role=role, tool_calls=fields.get("calls"), tool_call_id=fields.get("answers"))


def call(call_id, arguments='{"city": "Oslo"}'):
    return SimpleNamespace(id=call_id, function=SimpleNamespace(name="get_weather", arguments=arguments))


def test_the_historys_calls_and_results_are_checked_and_handed_on():
    fields = tools_api.history_calls(
        [message("user"), message("assistant", calls=[call("c1")]), message("tool", answers="c1")]
    )
    assert fields[0] == {} and fields[2] == {"tool_call_id": "c1"}
    ((name, arguments),) = [(c.name, c.arguments) for c in fields[1]["tool_calls"]]
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Oslo"})


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([message("tool", answers="c9")], "messages.0.tool_call_id"),  # answers no earlier call
        ([message("assistant", calls=[call("c1", "[1]")])], "messages.0.tool_calls.0.function.arguments"),
        ([message("assistant", calls=[call("c1", "{not json")])], "messages.0.tool_calls.0.function.arguments"),
    ],
)
def test_a_bad_history_is_refused_naming_the_field(messages, param):
    with pytest.raises(RequestError) as info:
        tools_api.history_calls(messages)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_REQUEST, param)


def done(text: str, finish: str = "stop") -> Done:
    return Done(text, (1,), finish, Usage(1, 0, 1), Timings(1.0, 1.0, 1.0, 1.0))


def test_a_reply_is_read_as_its_calls_with_finish_tool_calls_or_as_text():
    parsed, finish = tools_api.read_reply(plan(), done(CALL))
    assert finish == "tool_calls" and [c.name for c in parsed.calls] == ["get_weather"]
    parsed, finish = tools_api.read_reply(plan(), done('{"response":"Sunny."}', "length"))
    assert (parsed.content, parsed.calls, finish) == ("Sunny.", (), "length")
    parsed, finish = tools_api.read_reply(None, done(CALL, "cancelled"))  # no tools: the text as it is
    assert (parsed.content, finish) == (CALL, "stop")


def test_wire_calls_have_fresh_ids_and_an_index_in_stream_deltas():
    calls = plan().format.parse(CALL).calls * 2
    whole, deltas = tools_api.wire_calls(calls), tools_api.wire_calls(calls, with_index=True)
    assert whole[0]["function"] == {"name": "get_weather", "arguments": calls[0].arguments}
    assert whole[0]["type"] == "function" and whole[0]["id"].startswith("call_") and "index" not in whole[0]
    assert len({c["id"] for c in whole + deltas}) == 4 and [d["index"] for d in deltas] == [0, 1]
