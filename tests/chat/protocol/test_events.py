"""Wire types across the protocol: the event unions and their type lists, serialization, non-finite numbers refused
(each event module's own rules: test_client_events, test_server_events, test_content, test_sampling)."""

from __future__ import annotations

import json
import typing

import pytest

from chat.protocol import (
    CLIENT_EVENT_TYPES,
    SERVER_EVENT_TYPES,
    ClientEvent,
    ErrorCode,
    ProtocolError,
    ServerEvent,
    parse_client_event,
    serialize_server_event,
)
from tests.chat.protocol.helpers import CLIENT_EXAMPLES, SERVER_EXAMPLES


def _tags(union: object) -> set[str]:
    members = typing.get_args(typing.get_args(union)[0])
    return {m.model_fields["type"].default for m in members}


def test_type_lists_match_the_unions():
    assert _tags(ClientEvent) == set(CLIENT_EVENT_TYPES)
    assert _tags(ServerEvent) == set(SERVER_EVENT_TYPES)


def test_every_event_type_has_an_example():
    assert {e.type for e in CLIENT_EXAMPLES} == set(CLIENT_EVENT_TYPES)
    assert {e.type for e in SERVER_EXAMPLES} == set(SERVER_EVENT_TYPES)


def test_serialize_leaves_out_none_and_uses_wire_values():
    delta = json.loads(serialize_server_event(SERVER_EXAMPLES[6]))
    assert delta == {"type": "reply.delta", "turn_id": "turn_2", "delta": "lo"}
    error = json.loads(serialize_server_event(SERVER_EXAMPLES[10]))
    assert error["code"] == "busy" and error["reply_to"] == "e4"


def test_nan_and_infinity_are_refused():
    for value in ("NaN", "Infinity", "1e999"):
        with pytest.raises(ProtocolError) as info:
            parse_client_event('{"type":"session.create","sampling":{"temperature":' + value + "}}")
        assert info.value.code is ErrorCode.INVALID_EVENT
        assert info.value.message == "sampling.temperature: Input should be a finite number"
