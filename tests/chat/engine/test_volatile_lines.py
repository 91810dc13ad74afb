"""Volatile client lines: Claude Code's billing line is dropped from the rendered prompt (never from the request's
messages), so two sessions that differ only in it share their whole prefix; with the lines kept, the miss they cause
is named ``volatile_line``."""

from __future__ import annotations

import copy

import pytest

from cache import PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from chat.engine.volatile_lines import DEFAULT_PATTERNS, VolatileLines
from tests.chat.engine.fakes import FakeRuntime

SYSTEM = "You are an agent that edits code.\n" + "Use the tools with care. " * 20


def billing(suffix: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.197.{suffix}; cc_entrypoint=sdk-cli;"


def session(suffix: str, question: str = "fix the bug in main.py") -> list[dict]:
    return [
        {"role": "system", "content": billing(suffix) + "\n" + SYSTEM},
        {"role": "user", "content": question},
    ]


def ask(runtime, cache, messages, volatile):
    turn = Turn(runtime, cache, TurnRequest(messages, SamplingParams(max_tokens=8)), volatile=volatile)
    done = run_to_end(turn)[1]
    return turn, done


@pytest.mark.parametrize(
    "line",
    [
        billing("c8e"),
        billing("0f1") + "  ",
        "x-anthropic-billing-header: cc_version=2.2.0.abc; cc_entrypoint=cli; cc_workload=agent;",
        "x-anthropic-billing-header:cc_version=9.9.9.fff;",
    ],
)
def test_the_billing_line_is_dropped_whatever_its_values(line):
    volatile = VolatileLines()
    assert volatile.strip_text(line + "\nYou are Claude Code.\n") == "You are Claude Code.\n"
    assert volatile.strip_text("intro\n" + line) == "intro\n"


@pytest.mark.parametrize(
    "text",
    [
        "see x-anthropic-billing-header: cc_version=2.1.197.c8e; in the logs",  # not at a line's start
        "x-anthropic-billing-header: nothing like key=value pairs",
        "x-anthropic-billing-header:",
    ],
)
def test_lines_of_another_shape_are_kept(text):
    assert VolatileLines().strip_text(text) == text


def test_a_header_joined_to_the_next_block_without_a_line_break_loses_only_the_header():
    joined = billing("c8e") + "You are Claude Code."
    assert VolatileLines().strip_text(joined) == "You are Claude Code."


def test_a_bad_pattern_is_named():
    with pytest.raises(ValueError, match=r"\(unclosed"):
        VolatileLines(["(unclosed"])


def test_the_rendered_prompt_lacks_the_line_and_the_request_keeps_it():
    runtime, cache = FakeRuntime(), PrefixCache()
    messages = session("c8e")
    before = copy.deepcopy(messages)
    turn, done = ask(runtime, cache, messages, VolatileLines())
    assert done.finish_reason in ("stop", "length")
    assert messages == before and turn.request.messages is messages  # what a session stores is the client's own
    assert b"x-anthropic-billing-header" not in bytes(t for t in turn.prompt if t < 256)
    assert runtime.decode(turn.prompt).startswith("You are an agent")
    assert done.usage.prompt_tokens == len(runtime.render(session("c8e"))) - len(billing("c8e")) - 1


def test_two_sessions_with_different_billing_lines_share_the_whole_prefix():
    runtime, cache = FakeRuntime(), PrefixCache()
    _, first = ask(runtime, cache, session("c8e"), VolatileLines())
    assert first.usage.cached_tokens == 0
    turn, second = ask(runtime, cache, session("3a7"), VolatileLines())
    assert second.usage.cached_tokens == len(turn.prompt) - 1  # everything but the last token, always computed
    assert second.usage.cache_miss_reason is None


def test_kept_lines_split_the_prefix_and_the_miss_is_named_volatile_line():
    runtime, cache = FakeRuntime(), PrefixCache()
    kept = VolatileLines(drop=False)
    ask(runtime, cache, session("c8e"), kept)
    turn, second = ask(runtime, cache, session("3a7"), kept)
    assert b"x-anthropic-billing-header" in bytes(t for t in turn.prompt if t < 256)
    where = 1 + billing("c8e").index("c8e")  # the system role token, then the line up to the 3 hex characters
    assert (second.usage.cache_miss_reason, second.usage.cache_miss_at) == ("volatile_line", where)
    assert second.usage.cached_tokens == where
    other_question = session("c8e", "now write the tests")  # a divergence outside the line: not this reason
    assert ask(runtime, cache, other_question, kept)[1].usage.cache_miss_reason == "diverged"


def test_without_volatile_patterns_the_same_miss_is_only_diverged():
    runtime, cache = FakeRuntime(), PrefixCache()
    ask(runtime, cache, session("c8e"), None)
    assert ask(runtime, cache, session("3a7"), None)[1].usage.cache_miss_reason == "diverged"
    cache = PrefixCache()
    ask(runtime, cache, session("c8e"), VolatileLines([]))
    assert ask(runtime, cache, session("3a7"), VolatileLines([]))[1].usage.cache_miss_reason == "diverged"


def test_text_parts_are_stripped_too_and_other_messages_are_left_as_they_are():
    volatile = VolatileLines(DEFAULT_PATTERNS)
    user = {"role": "user", "content": "hello"}
    messages = [{"role": "system", "content": [{"type": "text", "text": billing("c8e") + "\nrules"}]}, user]
    out = volatile.prompt_messages(messages)
    assert out[0]["content"] == [{"type": "text", "text": "rules"}] and out[1] is user
    assert messages[0]["content"][0]["text"].startswith("x-anthropic")
    assert VolatileLines(drop=False).prompt_messages(messages) is messages
