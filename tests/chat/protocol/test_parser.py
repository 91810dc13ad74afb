"""parse_client_event: every refusal is a ProtocolError with the right code, a field path, and the event_id."""

from __future__ import annotations

import json

import pytest

from chat.protocol import ErrorCode, ProtocolError, TurnCreate, parse_client_event
from chat.protocol import limits as L
from chat.protocol import parser as parser_module
from tests.chat.protocol.helpers import AUDIO_PART, IMAGE_PART, TEXT_PART, VIDEO_PART


def refusal(raw: str | bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_event(raw)
    return info.value


def event(**fields) -> str:
    return json.dumps(fields)


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


# ---------------------------------------------------------------- media

B64 = "QUJD"  # "ABC"
MEDIA = {
    "http url": ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "expected a data URL"),
    "video in image_url": (
        {"type": "image_url", "image_url": {"url": f"data:video/mp4;base64,{B64}"}},
        "data:image/<subtype>",
    ),
    "image in video_url": (
        {"type": "video_url", "video_url": {"url": f"data:image/png;base64,{B64}"}},
        "data:video/<subtype>",
    ),
    "not base64 encoded": ({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}, "expected a data"),
    "bad base64": ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}, "not valid base64"),
    "bad padding": ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,QUJ"}}, "not valid base64"),
    "empty image": ({"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}, "is empty"),
    "empty audio": ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "is empty"),
    "audio data url": (
        {"type": "input_audio", "input_audio": {"data": f"data:audio/wav;base64,{B64}", "format": "wav"}},
        "not valid base64",
    ),
}


@pytest.mark.parametrize(("part", "message"), MEDIA.values(), ids=MEDIA.keys())
def test_bad_media_is_invalid_media(part, message):
    err = refusal(event(type="turn.create", event_id="m", content=[TEXT_PART, part]))
    assert err.code is ErrorCode.INVALID_MEDIA
    assert err.message.startswith("content.1.") and message in err.message
    assert err.event_id == "m"


@pytest.mark.parametrize("part", [IMAGE_PART, AUDIO_PART, VIDEO_PART], ids=lambda p: p["type"])
def test_good_media_is_accepted(part):
    assert parse_client_event(event(type="turn.create", content=[part])).content[0].type == part["type"]


# ---------------------------------------------------------------- completion.create (stateless)


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


def test_the_depth_limit_is_max_json_depth():
    def nested(depth: int) -> str:  # an event whose event_id is a list nested `depth` deep in the top-level object
        return '{"type":"ping","event_id":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    assert refusal(nested(L.MAX_JSON_DEPTH)).code is ErrorCode.INVALID_EVENT  # parsed, then refused as an event
    assert refusal(nested(L.MAX_JSON_DEPTH + 2)).code is ErrorCode.INVALID_JSON
