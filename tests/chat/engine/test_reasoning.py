"""Thinking replies: split into reasoning and answer (whole and streamed, markers cut anywhere), grammars that apply
after the thinking, and a thinking budget that closes the thinking for the model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from chat.engine.constraints import GrammarCompiler, GrammarSpec, canonical_json
from chat.engine.events import TurnRequest
from chat.engine.reasoning import Markers, ReasoningSplitter, after_thinking, markers_of
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from chat.models.tiny.templates import HERMES_TOOLS, THINKING
from tests.chat.engine.fakes import FakeRuntime

M = Markers()
REPLY = "<think>\nLet me see: 2 + 2.\n</think>\n\nIt is 4."


def test_a_whole_reply_splits_into_reasoning_and_answer():
    assert M.split(REPLY) == ("Let me see: 2 + 2.", "It is 4.")
    assert M.split("Just 4.") == (None, "Just 4.")
    assert M.split("<think>still thinking when cut") == ("still thinking when cut", "")


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7])
def test_a_streamed_reply_splits_the_same_wherever_the_pieces_end(cut):
    splitter = ReasoningSplitter(M)
    pieces = [splitter.push(REPLY[i : i + cut]) for i in range(0, len(REPLY), cut)] + [splitter.flush()]
    assert "".join(r for r, _ in pieces) == "Let me see: 2 + 2."
    assert "".join(c for _, c in pieces) == "It is 4."


def test_a_reply_that_does_not_think_streams_as_content():
    splitter = ReasoningSplitter(M)
    pieces = [splitter.push(p) for p in ("  <th", "ink? no, ", "plain")] + [splitter.flush()]
    assert "".join(c for _, c in pieces) == "  <think? no, plain" and not any(r for r, _ in pieces)


def test_templates_that_think_are_recognised():
    assert markers_of(THINKING) == M and markers_of(HERMES_TOOLS) is None and markers_of(None) is None


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(FakeRuntime().constraint_tokenizer())


SCHEMA = {"type": "object", "properties": {"n": {"enum": [3, 4]}}, "required": ["n"], "additionalProperties": False}


def run(params, compiler, script):
    runtime = FakeRuntime(script=script)
    grammar = compiler.compile(params.grammar) if params.grammar else None
    return run_to_end(Turn(runtime, None, TurnRequest([{"role": "user", "content": "q"}], params), grammar=grammar))[1]


def test_structured_output_applies_after_the_thinking(compiler):
    spec = after_thinking(M, GrammarSpec("json_schema", canonical_json(SCHEMA)))
    done = run(
        SamplingParams(max_tokens=200, grammar=spec), compiler, lambda p: '<think>hmm {not json}</think>{"n":4} etc'
    )
    reasoning, answer = M.split(done.text)
    assert done.finish_reason == "stop" and reasoning == "hmm {not json}"  # the thinking was free
    jsonschema.validate(json.loads(answer), SCHEMA)


def test_a_thinking_budget_closes_the_thinking_for_the_model(compiler):
    endless = lambda p: "<think>" + "la" * 500  # noqa: E731
    markers = {"thinking_start": tuple(b"<think>"), "thinking_end": tuple(b"</think>")}
    params = SamplingParams(max_tokens=100, thinking_budget=13, **markers)
    done = run(params, compiler, endless)
    reasoning, _ = M.split(done.text)
    assert done.text.startswith("<think>") and "</think>" in done.text
    assert len(done.text.split("</think>")[0]) == 20 and reasoning == "la" * 6 + "l"
    spec = after_thinking(M, GrammarSpec("json_schema", canonical_json(SCHEMA)))
    constrained = run(
        SamplingParams(max_tokens=100, grammar=spec, thinking_budget=13, **markers),
        compiler,
        endless,
    )
    assert constrained.finish_reason == "stop"
    jsonschema.validate(json.loads(M.split(constrained.text)[1]), SCHEMA)


def test_a_lark_grammar_follows_thinking_under_its_own_start_rule(compiler):
    spec = after_thinking(M, GrammarSpec("grammar", 'start: "yes" | "no"'))
    done = run(SamplingParams(max_tokens=50, grammar=spec), compiler, lambda p: "<think>ok</think>no way")
    assert done.text == "<think>ok</think>no"
    with pytest.raises(ValueError):
        after_thinking(M, GrammarSpec("grammar", 'answer: "x"'))
