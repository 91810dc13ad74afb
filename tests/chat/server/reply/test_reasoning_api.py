"""Thinking replies' settings (``chat/server/reply/reasoning_api.py``): the markers of a request, its template
variables, a grammar moved after the thinking, the thinking budget and its typed refusals, and the background turn
that settles a thought reply's history. (Over HTTP: tests/chat/server/test_reasoning_http.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chat.engine.constraints import GrammarSpec
from chat.engine.events import TurnRequest
from chat.engine.reasoning import Markers
from chat.engine.sampling import SamplingParams
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.reasoning_api import apply, settle, thinking_markers

USER = [{"role": "user", "content": "2 + 2?"}]


def runtime(thinks: bool = True, window: int | None = 64):
    return SimpleNamespace(
        reasoning=Markers() if thinks else None, context_window=window, encode=lambda text: [len(text), 0]
    )


def test_the_markers_are_the_models_unless_the_request_turns_thinking_off():
    assert thinking_markers(runtime(), None) == Markers()
    assert thinking_markers(runtime(), {"enable_thinking": True}) == Markers()
    assert thinking_markers(runtime(), {"enable_thinking": False}) is None
    assert thinking_markers(runtime(thinks=False), None) is None


def test_a_turn_gets_its_template_variables_its_budget_and_the_markers_tokens():
    turn = apply(TurnRequest(USER), runtime(), {"enable_thinking": True, "x": 1}, budget=10)
    assert turn.template_kwargs == {"enable_thinking": True, "x": 1}
    assert turn.params.thinking_budget == 10
    assert (turn.params.thinking_start, turn.params.thinking_end) == ((7, 0), (8, 0))  # encode("<think>"), ...
    assert turn.params.grammar is None  # no grammar asked: none added


def test_a_grammar_applies_after_the_thinking_and_not_when_thinking_is_off():
    grammar = GrammarSpec("json_object", None)
    turn = apply(TurnRequest(USER, SamplingParams(grammar=grammar)), runtime(), None, None)
    assert turn.params.grammar.kind == "grammar" and '"<think>"' in turn.params.grammar.source
    off = apply(TurnRequest(USER, SamplingParams(grammar=grammar)), runtime(), {"enable_thinking": False}, None)
    assert off.params.grammar is grammar and off.template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("thinks", "kwargs", "budget", "code"),
    [
        (False, None, 5, ErrorCode.INVALID_REQUEST),  # the model does not think
        (True, {"enable_thinking": False}, 5, ErrorCode.INVALID_REQUEST),  # thinking turned off
        (True, None, 64, ErrorCode.CONTEXT_OVERFLOW),  # no room left in the 64-token window
    ],
)
def test_a_thinking_budget_that_cannot_apply_is_refused_naming_it(thinks, kwargs, budget, code):
    with pytest.raises(RequestError) as info:
        apply(TurnRequest(USER), runtime(thinks), kwargs, budget)
    assert (info.value.code, info.value.param) == (code, "thinking_budget")


def test_a_grammar_that_cannot_follow_thinking_is_refused_naming_response_format():
    bad = GrammarSpec("grammar", 'answer: "x"\n')  # no start rule
    with pytest.raises(RequestError) as info:
        apply(TurnRequest(USER, SamplingParams(grammar=bad)), runtime(), None, None)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_GRAMMAR, "response_format")


class Engine:
    def __init__(self) -> None:
        self.submitted: list[TurnRequest] = []
        self.unmetered = self  # a tenant's view hands over the server's own engine

    def submit(self, request, sink):
        self.submitted.append(request)


def test_a_thought_reply_is_settled_as_its_answer_without_the_thinking():
    engine = Engine()
    metered = SimpleNamespace(unmetered=engine, submit=None)  # the tenant's view: never charged for it
    done = SimpleNamespace(finish_reason="stop", text="<think>\nhm\n</think>\n\nfour")
    settle(metered, TurnRequest(USER), Markers(), False, done)
    (request,) = engine.submitted
    assert request.messages == [*USER, {"role": "assistant", "content": "four"}]
    assert request.params.max_tokens == 0  # the prompt only: stored, nothing generated


@pytest.mark.parametrize(
    ("markers", "may_call", "finish", "text", "prompt_tokens"),
    [
        (None, False, "stop", "<think>x</think>a", None),  # the request does not think
        (Markers(), True, "stop", "<think>x</think>a", None),  # it may have called tools
        (Markers(), False, "length", "<think>x</think>a", None),  # cut
        (Markers(), False, "stop", "no thinking here", None),  # it did not think
        (Markers(), False, "stop", "<think>x</think>a", [1, 2]),  # a rendered prompt: no history to settle
    ],
)
def test_nothing_is_settled_for_a_reply_that_did_not_think_or_did_not_end_well(
    markers, may_call, finish, text, prompt_tokens
):
    engine = Engine()
    settle(
        engine,
        TurnRequest(USER, prompt_tokens=prompt_tokens),
        markers,
        may_call,
        SimpleNamespace(finish_reason=finish, text=text),
    )
    assert engine.submitted == []
