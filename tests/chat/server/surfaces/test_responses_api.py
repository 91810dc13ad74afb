"""Responses API requests (``chat/server/surfaces/responses_api.py``): fields not honoured refused by name, ``input``
items as chat messages (a run of function calls one assistant message, reasoning dropped), and a deletion's answer.
(Over HTTP with a stored conversation: tests/chat/server/test_responses.py; the bytes: test_wire_bodies.py.)"""

from __future__ import annotations

import json

import pytest

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.surfaces.responses_api import ResponsesRequest, deleted, input_messages


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"background": True}, "background", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"reasoning": {"effort": "low"}}, "reasoning", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"reasoning": "low"}, "reasoning", ErrorCode.INVALID_REQUEST),
    ],
)
def test_fields_not_honoured_are_refused_by_name(fields, param, code):
    ResponsesRequest(input="hi", reasoning={"effort": None}).check()  # a neutral value passes
    with pytest.raises(RequestError) as info:
        ResponsesRequest.model_validate({"input": "hi", **fields}).check()
    assert (info.value.code, info.value.param) == (code, param)


def test_input_items_become_chat_messages():
    call = {"type": "function_call", "name": "f", "arguments": '{"a": 1}'}
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "reasoning", "summary": []},  # the history is rendered without its thinking
        {**call, "call_id": "c1"},
        {**call, "call_id": "c2"},  # one assistant message for the run of calls
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "function_call_output", "call_id": "c2", "output": {"n": 2}},
    ]
    messages = input_messages(items)
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"] and messages[2]["content"] is None
    assert messages[3]["content"] == "ok" and json.loads(messages[4]["content"]) == {"n": 2}
    assert input_messages("just text") == [{"role": "user", "content": "just text"}]


@pytest.mark.parametrize(
    ("item", "param", "code"),
    [
        ({"role": "robot", "content": "x"}, "input.0.role", ErrorCode.INVALID_REQUEST),
        ({"type": "item_reference", "id": "x"}, "input.0.type", ErrorCode.UNSUPPORTED_PARAMETER),
    ],
)
def test_a_bad_item_is_refused_naming_it(item, param, code):
    with pytest.raises(RequestError) as info:
        input_messages([item])
    assert (info.value.code, info.value.param) == (code, param)


def test_a_deletion_answers_openais_deleted_object():
    answer = deleted("resp_1")
    assert answer.media_type == "application/json"
    assert json.loads(answer.body) == {"id": "resp_1", "object": "response", "deleted": True}
