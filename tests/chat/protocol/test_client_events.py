"""chat.protocol.client_events: every client event survives a round trip through JSON; completion.create's rules on its
message list."""

from __future__ import annotations

import json

import pytest

from chat.protocol import ErrorCode, parse_client_event
from chat.protocol import limits as L
from tests.chat.protocol.helpers import CLIENT_EXAMPLES, IMAGE_PART, TEXT_PART, event, refusal


@pytest.mark.parametrize("event", CLIENT_EXAMPLES, ids=lambda e: e.type)
def test_client_event_round_trip(event):
    raw = event.model_dump_json(exclude_none=True)
    assert parse_client_event(raw) == event
    assert parse_client_event(raw.encode()) == event
    assert json.loads(raw)["type"] == event.type


def completion(messages, **extra) -> str:
    return event(type="completion.create", event_id="c", messages=messages, **extra)


STATELESS = {
    "no messages": ([], ErrorCode.INVALID_EVENT, "messages: List should have at least 1"),
    "system later": (
        [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}, {"role": "user", "content": "b"}],
        ErrorCode.INVALID_EVENT,
        "a system message may only come first",
    ),
    "ends with assistant": (
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        ErrorCode.INVALID_EVENT,
        "the last message must be a user message or a tool result",
    ),
    "function role": ([{"role": "function", "content": "x"}], ErrorCode.INVALID_EVENT, "messages.0.role"),
    "tool result without its call id": (
        [{"role": "user", "content": "a"}, {"role": "tool", "content": "x"}],
        ErrorCode.INVALID_EVENT,
        "a tool message needs tool_call_id",
    ),
    "tool result answering no call": (
        [{"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
        ErrorCode.INVALID_EVENT,
        "messages.1.tool_call_id answers no call of an earlier assistant message",
    ),
    "tool calls from the user": (
        [{"role": "user", "content": "a", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}],
        ErrorCode.INVALID_EVENT,
        "only assistant messages carry tool_calls",
    ),
    "media from the assistant": (
        [{"role": "assistant", "content": [IMAGE_PART]}, {"role": "user", "content": "x"}],
        ErrorCode.INVALID_MEDIA,
        "only user messages may hold media",
    ),
    "too many messages": (
        [{"role": "user", "content": "x"}] * (L.MAX_MESSAGES + 1),
        ErrorCode.INVALID_EVENT,
        "messages: List should have at most",
    ),
    "too many media": (
        [{"role": "user", "content": [IMAGE_PART] * 8}] * (L.MAX_MEDIA_PER_CONVERSATION // 8 + 1),
        ErrorCode.INVALID_EVENT,
        f"more than {L.MAX_MEDIA_PER_CONVERSATION} media items in one conversation",
    ),
}


@pytest.mark.parametrize(("messages", "code", "message"), STATELESS.values(), ids=STATELESS.keys())
def test_completion_create_rules(messages, code, message):
    err = refusal(completion(messages))
    assert err.code is code and message in err.message and err.event_id == "c"


def test_completion_create_accepts_a_whole_conversation():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [TEXT_PART, IMAGE_PART]},
        {"role": "assistant", "content": [{"type": "text", "text": "A red pixel."}]},
        {"role": "user", "content": "And its size?"},
    ]
    parsed = parse_client_event(completion(messages, sampling={"seed": 1}))
    assert [m.role for m in parsed.messages] == ["system", "user", "assistant", "user"]
    assert parsed.sampling.seed == 1
