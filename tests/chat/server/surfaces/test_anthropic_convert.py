"""Anthropic's requests as chat requests (``chat/server/surfaces/anthropic_convert.py``): what is not honoured refused
by name, the system and messages converted, the reply cap and thinking as applied, and the breakpoints put on the
turns. (Over HTTP, with breakpoints measured and pinned: tests/chat/server/test_anthropic.py.)"""

from __future__ import annotations

import pytest

from chat.engine.events import CacheBreakpoint, TurnRequest
from chat.engine.reasoning import Markers
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.surfaces import anthropic_convert
from chat.server.surfaces import anthropic_types as wire
from tests.chat.engine.fakes import FakeRuntime

USER = [{"role": "user", "content": "hi"}]


def body(**fields) -> wire.MessagesRequest:
    return wire.MessagesRequest.model_validate({"model": "m", "max_tokens": 50, "messages": USER, **fields})


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"container": "c1"}, "container", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"speed": "fast"}, "speed", ErrorCode.UNSUPPORTED_PARAMETER),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages.0.content.0",
            ErrorCode.INVALID_REQUEST,
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 50}}, "thinking.budget_tokens", ErrorCode.INVALID_REQUEST),
        (
            {"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}] * 5},
            "cache_control",
            ErrorCode.INVALID_REQUEST,
        ),
    ],
)
def test_what_is_not_honoured_is_refused_naming_the_field(fields, param, code):
    anthropic_convert.check(body())  # the plain request passes
    with pytest.raises(RequestError) as info:
        anthropic_convert.check(body(**fields))
    assert (info.value.code, info.value.param) == (code, param)


def test_the_system_and_the_messages_become_a_chat_request_capped_by_the_window():
    runtime = FakeRuntime()
    got = anthropic_convert.to_chat(body(system="Be brief.", max_tokens=10**6, stop_sequences=["END"]), runtime)
    assert [(m.role, m.content) for m in got.chat.messages] == [("system", "Be brief."), ("user", "hi")]
    assert got.max_tokens == got.chat.max_tokens == runtime.context_window - 1 and got.chat.stop == ["END"]
    assert got.thinking is None and got.chat.chat_template_kwargs is None  # a model that does not think


def test_thinking_is_applied_by_the_template_or_reported_unsupported():
    asked = {"thinking": {"type": "enabled", "budget_tokens": 20}}
    plain = anthropic_convert.to_chat(body(**asked), FakeRuntime())
    assert (plain.thinking, plain.thinking_budget) == ("unsupported", None)

    class Thinker(FakeRuntime):
        reasoning = Markers()

    thinker = anthropic_convert.to_chat(body(**asked), Thinker())
    assert (thinker.thinking, thinker.thinking_budget, thinker.chat.thinking_budget) == ("template", 20, 20)
    not_asked = anthropic_convert.to_chat(body(), Thinker())  # Anthropic's default: no thinking
    assert not_asked.thinking is None and not_asked.chat.chat_template_kwargs == {"enable_thinking": False}


def test_count_tokens_counts_the_prompt_the_turn_renders():
    runtime = FakeRuntime()
    request = wire.CountTokensRequest.model_validate({"model": "m", "system": "Be brief.", "messages": USER})
    counted = anthropic_convert.count_tokens(request, "", runtime)
    expected = runtime.render([{"role": "system", "content": "Be brief."}, *USER])
    assert counted == {"input_tokens": len(expected)}


def test_the_breakpoints_are_put_on_every_turn():
    marks = (CacheBreakpoint(4, 300, "system.0"),)
    turns = anthropic_convert.with_breakpoints([TurnRequest(USER), TurnRequest(USER)], marks)
    assert [t.breakpoints for t in turns] == [marks, marks]
