"""Anthropic's replies (``chat/server/surfaces/anthropic_api.py``): errors in its shape and statuses, usage as it
counts the cache (read, created before the last breakpoint, by TTL), thinking signatures, and its routes named.
(The Messages API over HTTP, whole and streamed: tests/chat/server/test_anthropic.py.)"""

from __future__ import annotations

import json

import pytest

from chat.engine.errors import EngineClosedError
from chat.engine.events import CacheBreakpoint, Usage
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.surfaces import anthropic_api
from chat.server.surfaces.anthropic_convert import Converted


@pytest.mark.parametrize(
    ("exc", "status", "kind", "says"),
    [
        (RequestError(ErrorCode.INVALID_REQUEST, "bad", param="max_tokens"), 400, "invalid_request_error",
         "bad (invalid_request, param: max_tokens)"),
        (RequestError(ErrorCode.MODEL_NOT_FOUND, "no model"), 404, "not_found_error", "no model (model_not_found)"),
        (EngineClosedError("shut down"), 529, "overloaded_error", "(unavailable)"),  # Anthropic's overloaded status
        (RuntimeError("secret detail"), 500, "api_error", None),  # internal: no detail, no code
    ],
)  # fmt: skip
def test_errors_have_anthropics_status_type_and_our_code_in_the_message(exc, status, kind, says):
    got_status, body = anthropic_api.error_status_and_body(exc)
    assert got_status == status and body["type"] == "error" and body["error"]["type"] == kind
    message = body["error"]["message"]
    assert says in message if says else "secret detail" not in message and "(" not in message
    event = anthropic_api.stream_error(exc)
    assert event.startswith(b"event: error\ndata: ") and json.loads(event.split(b"data: ")[1]) == body


def test_only_the_messages_routes_are_anthropics():
    assert anthropic_api.is_anthropic("/v1/messages") and anthropic_api.is_anthropic("/v1/messages/count_tokens")
    assert not anthropic_api.is_anthropic("/v1/chat/completions") and not anthropic_api.is_anthropic("/v1/messages/x")


def converted(max_tokens: int = 100) -> Converted:
    return Converted(chat=None, marks=[], max_tokens=max_tokens, thinking=None, thinking_budget=None)


def test_usage_splits_the_prompt_into_read_created_before_the_last_breakpoint_and_the_rest():
    marks = (CacheBreakpoint(40, 300, "system.0"), CacheBreakpoint(70, 3600, "messages.0.content.0"))
    u = anthropic_api.usage(Usage(100, 30, 5), marks, converted(), window=120)
    assert (u.cache_read_input_tokens, u.cache_creation_input_tokens, u.input_tokens) == (30, 40, 30)
    assert u.cache_creation == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 40}  # the longest TTL
    assert u.output_tokens == 5 and u.turncache.max_tokens == 20  # the cap: the window's room after the prompt
    warm = anthropic_api.usage(Usage(100, 90, 5), marks, converted(), window=None)
    assert (warm.cache_read_input_tokens, warm.cache_creation_input_tokens, warm.input_tokens) == (90, 0, 10)
    assert warm.turncache.max_tokens == 100
    short = anthropic_api.usage(Usage(100, 10, 0), marks[:1], converted(), window=None)
    assert short.cache_creation == {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 0}


def test_usage_before_anything_is_known_is_zeros():
    u = anthropic_api.usage(None, (CacheBreakpoint(40, 300),), converted(7), window=50)
    assert (u.input_tokens, u.output_tokens, u.cache_creation_input_tokens, u.turncache.max_tokens) == (0, 0, 0, 7)


def test_a_thinking_signature_is_a_digest_of_its_text():
    assert anthropic_api.signature("hm") == anthropic_api.signature("hm") != anthropic_api.signature("hm.")
    assert anthropic_api.signature("hm").startswith("turncache-") and len(anthropic_api.signature("")) == 74
