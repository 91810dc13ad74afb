"""chat.protocol.content: message content in the OpenAI shape, media validated once (base64 decoded, bytes hashed) and
handed on by digest, the content rules."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from pydantic_core import PydanticCustomError

from chat.protocol import ErrorCode, parse_client_event
from chat.protocol.content import (
    ChatMessage,
    ImageURLPart,
    InputAudioPart,
    PromptMessage,
    TextPart,
    check_tool_messages,
    is_blank,
    media_parts,
    to_wire,
)
from modalities.parts import Base64Text
from tests.chat.protocol.helpers import AUDIO_PART, IMAGE_PART, PNG_B64, TEXT_PART, VIDEO_PART, event, refusal


def test_content_parts_keep_the_openai_shape():
    raw = json.dumps({"type": "turn.create", "content": [TEXT_PART, IMAGE_PART, AUDIO_PART, VIDEO_PART]})
    event = parse_client_event(raw)
    assert [p.model_dump(exclude_none=True) for p in event.content] == [TEXT_PART, IMAGE_PART, AUDIO_PART, VIDEO_PART]


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


def test_a_validated_media_part_hands_the_engine_its_digest_and_bytes_without_decoding_again():
    part = ImageURLPart.model_validate(IMAGE_PART)
    url = IMAGE_PART["image_url"]["url"]
    data = base64.b64decode(PNG_B64)
    assert part.image_url.url == url  # serializes as the string it is
    item = part.media("messages[0].content[1]")
    assert (item.kind, item.declared, item.item) == ("image", "image/png", "messages[0].content[1]")
    assert item.digest == hashlib.sha256(data).hexdigest()
    assert isinstance(item.source, Base64Text) and item.source.text is part.image_url.url  # no copy of the text
    assert item.data == data
    audio = InputAudioPart.model_validate(AUDIO_PART).media("a")
    assert (audio.kind, audio.declared) == ("audio", "wav")
    assert audio.data == base64.b64decode(AUDIO_PART["input_audio"]["data"])


def test_blank_content_and_media_parts():
    text, image = TextPart(text="  "), ImageURLPart.model_validate(IMAGE_PART)
    assert is_blank(" \n") and not is_blank("x")
    assert is_blank([text]) and not is_blank([text, image]) and not is_blank([TextPart(text="x")])
    assert media_parts("text") == [] and media_parts(None) == [] and media_parts([text, image]) == [image]
    assert to_wire("x") == "x" and to_wire([text, image]) == [{"type": "text", "text": "  "}, IMAGE_PART]


def test_a_message_becomes_a_prompt_message_with_its_calls_and_a_tool_results_call_id():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = ChatMessage.model_validate({"role": "assistant", "content": "", "tool_calls": [call]}).prompt()
    assert (asked.role, asked.content, [c.id for c in asked.tool_calls]) == ("assistant", "", ["call_1"])
    answer = ChatMessage.model_validate({"role": "tool", "content": "42", "tool_call_id": "call_1"})
    assert answer.prompt() == PromptMessage("tool", "42", (), "call_1")
    check_tool_messages([ChatMessage.model_validate({"role": "user", "content": "q"}), asked, answer])
    with pytest.raises(PydanticCustomError, match=r"messages\.0\.tool_call_id"):
        check_tool_messages([answer])  # answers no earlier call
