"""chat.protocol.server_events: every server event survives a round trip through JSON; usage follows OpenAI's shape and
adds up."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from chat.protocol import Usage, parse_server_event, serialize_server_event
from tests.chat.protocol.helpers import SERVER_EXAMPLES


@pytest.mark.parametrize("event", SERVER_EXAMPLES, ids=lambda e: e.type)
def test_server_event_round_trip(event):
    raw = serialize_server_event(event)
    assert parse_server_event(raw) == event
    assert json.loads(raw)["type"] == event.type


def test_reply_done_carries_openai_usage_and_timings():
    done = json.loads(serialize_server_event(SERVER_EXAMPLES[7]))
    assert done["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 8,
        "total_tokens": 128,
        "prompt_tokens_details": {"cached_tokens": 96},
    }
    assert done["timings"] == {"ttft_ms": 41.5, "decode_tokens_per_s": 21.3, "total_ms": 370.0, "prefill_ms": 30.1}


def test_usage_must_be_consistent():
    with pytest.raises(ValidationError, match="total_tokens"):
        Usage(prompt_tokens=1, completion_tokens=1, total_tokens=3, prompt_tokens_details={"cached_tokens": 0})
    with pytest.raises(ValidationError, match="cached_tokens"):
        Usage.of(prompt_tokens=1, completion_tokens=1, cached_tokens=2)
