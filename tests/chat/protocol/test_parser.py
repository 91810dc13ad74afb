"""parse_client_event: every refusal is a ProtocolError with the right code, a field path, and the event_id."""

from __future__ import annotations

import json

import pytest

from chat.protocol import ErrorCode, TurnCreate, parse_client_event
from chat.protocol import limits as L
from chat.protocol import parser as parser_module
from tests.chat.protocol.helpers import IMAGE_PART, TEXT_PART, event, refusal

# ---------------------------------------------------------------- frame size


def test_a_frame_of_exactly_the_limit_is_parsed():
    def frame(data: str, event_id: str) -> str:
        return event(type="turn.create", event_id=event_id, content=[{"type": "image_url", "image_url": {"url": data}}])

    room = L.MAX_FRAME_BYTES - len(frame("data:image/png;base64,", "e"))
    data = "data:image/png;base64," + "A" * (room - room % 4)
    raw = frame(data, "e" * (1 + room % 4))
    assert len(raw.encode()) == L.MAX_FRAME_BYTES
    assert isinstance(parse_client_event(raw), TurnCreate)


@pytest.mark.parametrize("kind", [str, bytes])
def test_a_frame_over_the_limit_is_refused(kind):
    raw = event(type="turn.create", content="x" * L.MAX_FRAME_BYTES, event_id="big")
    err = refusal(raw if kind is str else raw.encode())
    assert err.code is ErrorCode.FRAME_TOO_LARGE
    assert err.event_id is None  # a frame that large is not parsed at all


def test_the_limit_counts_utf8_bytes_not_characters(monkeypatch):
    monkeypatch.setattr(parser_module, "MAX_FRAME_BYTES", 40)
    narrow = '{"type":"turn.create","content":"abcd"}'  # 39 characters, 39 bytes
    wide = '{"type":"turn.create","content":"éééé"}'  # 39 characters, 43 bytes
    assert isinstance(parse_client_event(narrow), TurnCreate)
    assert refusal(wide).code is ErrorCode.FRAME_TOO_LARGE


# ---------------------------------------------------------------- not JSON

NOT_JSON = {
    "empty": "",
    "garbage": "hello",
    "truncated": '{"type": "ping"',
    "trailing": '{"type": "ping"} x',
    "single quotes": "{'type': 'ping'}",
    "bad utf-8": b'{"type": "ping", "event_id": "\xff"}',
    "lone surrogate": '{"type": "ping", "event_id": "\ud800"}',
    "escaped lone surrogate": '{"type": "ping", "event_id": "\\ud800"}',
    "deep arrays": "[" * 100_000 + "]" * 100_000,
    "deep objects": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "deep inside an event": '{"type":"ping","event_id":' + "[" * 10_000 + "]" * 10_000 + "}",
}


@pytest.mark.parametrize("raw", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_not_json_is_invalid_json(raw):
    err = refusal(raw)
    assert err.code is ErrorCode.INVALID_JSON
    assert err.event_id is None


def test_a_recursion_error_becomes_invalid_json(monkeypatch):
    class Exploding:
        def validate_json(self, *args, **kwargs):
            raise RecursionError

    monkeypatch.setattr(parser_module, "_CLIENT", Exploding())
    assert refusal('{"type":"ping"}').code is ErrorCode.INVALID_JSON


# ---------------------------------------------------------------- not an event

NOT_EVENTS = {
    "array": ("[]", ErrorCode.INVALID_EVENT, "the frame must be a JSON object"),
    "number": ("1", ErrorCode.INVALID_EVENT, "the frame must be a JSON object"),
    "string": ('"ping"', ErrorCode.INVALID_EVENT, "the frame must be a JSON object"),
    "null": ("null", ErrorCode.INVALID_EVENT, "the frame must be a JSON object"),
    "no type": ('{"event_id": "a"}', ErrorCode.INVALID_EVENT, "type: Field required"),
    "numeric type": ('{"type": 1, "event_id": "a"}', ErrorCode.INVALID_EVENT, "type: Input should be a valid string"),
    "null type": ('{"type": null, "event_id": "a"}', ErrorCode.INVALID_EVENT, "type: Input should be a valid string"),
    "unknown type": ('{"type": "session.delete", "event_id": "a"}', ErrorCode.UNKNOWN_EVENT, "'session.delete'"),
    "server type": ('{"type": "pong", "event_id": "a"}', ErrorCode.UNKNOWN_EVENT, "'pong'"),
}


@pytest.mark.parametrize(("raw", "code", "message"), NOT_EVENTS.values(), ids=NOT_EVENTS.keys())
def test_frames_that_are_not_client_events(raw, code, message):
    err = refusal(raw)
    assert err.code is code
    assert message in err.message
    assert err.event_id == (json.loads(raw).get("event_id") if raw.startswith("{") else None)


def test_an_unknown_type_is_truncated_in_the_message():
    err = refusal(event(type="x" * 10_000))
    assert err.code is ErrorCode.UNKNOWN_EVENT and len(err.message) < 200


# ---------------------------------------------------------------- invalid events: field paths, event_id recovery

AIFF = {"data": "AAAA", "format": "aiff"}
HUGE_DETAIL = {**IMAGE_PART["image_url"], "detail": "huge"}
INVALID = {
    "missing field": (event(type="turn.create", event_id="a"), "content: Field required"),
    "extra field": (event(type="ping", event_id="a", foo=1), "foo: Extra inputs are not permitted"),
    "wrong type": (event(type="session.resume", event_id="a", session_id=5), "session_id: Input should be a valid"),
    "empty id": (event(type="session.resume", event_id="a", session_id=""), "session_id: String should have at least"),
    "content not str/list": (event(type="turn.create", event_id="a", content={"x": 1}), "content: content must be"),
    "part without text": (event(type="turn.create", event_id="a", content=[{"type": "text"}]), "content.0.text: Field"),
    "unknown part": (
        event(type="turn.create", event_id="a", content=[{"type": "file"}]),
        "content.0: Input tag 'file'",
    ),
    "bad audio format": (
        event(type="turn.create", event_id="a", content=[{"type": "input_audio", "input_audio": AIFF}]),
        "content.0.input_audio.format: Input should be",
    ),
    "image detail": (
        event(type="turn.create", event_id="a", content=[{"type": "image_url", "image_url": HUGE_DETAIL}]),
        "content.0.image_url.detail",
    ),
    "empty content list": (event(type="turn.create", event_id="a", content=[]), "content: List should have at least 1"),
    "blank content": (event(type="turn.create", event_id="a", content="  \n"), "content: the message is empty"),
    "blank text parts": (event(type="turn.create", event_id="a", content=[{"type": "text", "text": ""}]), "is empty"),
    "too many parts": (
        event(type="turn.create", event_id="a", content=[TEXT_PART] * (L.MAX_PARTS_PER_MESSAGE + 1)),
        "content: List should have at most",
    ),
    "too many media": (
        event(type="turn.create", event_id="a", content=[IMAGE_PART] * (L.MAX_MEDIA_PER_TURN + 1)),
        f"more than {L.MAX_MEDIA_PER_TURN} media items",
    ),
    "string too long": (
        event(type="turn.create", event_id="a", content="x" * (L.MAX_TEXT_CHARS + 1)),
        "content: String should have at most",
    ),
    "parts too long together": (
        event(
            type="turn.create", event_id="a", content=[{"type": "text", "text": "x" * (L.MAX_TEXT_CHARS // 2 + 1)}] * 2
        ),
        f"more than {L.MAX_TEXT_CHARS} characters",
    ),
    "system too long": (
        event(type="session.create", event_id="a", system="x" * (L.MAX_TEXT_CHARS + 1)),
        "system: String should have at most",
    ),
    "edit with neither": (
        event(type="turn.edit", event_id="a", content="x"),
        "give exactly one of index and message_id",
    ),
    "edit with both": (event(type="turn.edit", event_id="a", content="x", index=0, message_id="m"), "exactly one"),
    "edit negative index": (event(type="turn.edit", event_id="a", content="x", index=-1), "index: Input should be"),
    "edit float index": (
        event(type="turn.edit", event_id="a", content="x", index=1.0),
        "index: Input should be a valid",
    ),
    "model too long": (
        event(type="session.create", event_id="a", model="m" * (L.MAX_MODEL_CHARS + 1)),
        "model: String should have at most",
    ),
}


@pytest.mark.parametrize(("raw", "message"), INVALID.values(), ids=INVALID.keys())
def test_invalid_events_name_the_field(raw, message):
    err = refusal(raw)
    assert err.code is ErrorCode.INVALID_EVENT
    assert message in err.message
    assert err.event_id == "a"


def test_many_errors_are_summarised():
    raw = event(
        type="session.create", sampling={"temperature": -1, "top_p": 2, "top_k": -1, "max_tokens": 0, "seed": -1}
    )
    err = refusal(raw)
    assert err.message.count("sampling.") == 3 and err.message.endswith("(and 2 more)")


def test_event_id_is_echoed_only_when_it_is_a_valid_one():
    assert (
        refusal(event(type="turn.create", event_id="x" * L.MAX_EVENT_ID_CHARS)).event_id == "x" * L.MAX_EVENT_ID_CHARS
    )
    assert refusal(event(type="turn.create", event_id="x" * (L.MAX_EVENT_ID_CHARS + 1))).event_id is None
    assert refusal(event(type="turn.create", event_id=7)).event_id is None
    assert refusal(event(type="turn.create", event_id="")).event_id is None
    assert refusal(event(type="turn.create", event_id="e1")).event_id == "e1"
    assert refusal(event(type="turn.create", event_id="e1").encode()).event_id == "e1"


def test_an_invalid_event_id_is_itself_an_invalid_event():
    err = refusal(event(type="ping", event_id="x" * (L.MAX_EVENT_ID_CHARS + 1)))
    assert err.code is ErrorCode.INVALID_EVENT and err.message.startswith("event_id:")


def test_the_depth_limit_is_max_json_depth():
    def nested(depth: int) -> str:  # an event whose event_id is a list nested `depth` deep in the top-level object
        return '{"type":"ping","event_id":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    assert refusal(nested(L.MAX_JSON_DEPTH)).code is ErrorCode.INVALID_EVENT  # parsed, then refused as an event
    assert refusal(nested(L.MAX_JSON_DEPTH + 2)).code is ErrorCode.INVALID_JSON
