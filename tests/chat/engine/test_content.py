"""Content parts -> engine messages: text joined, media refused by models without the modality, media unpacked into
MediaParts (and unreadable payloads refused) for models with it. Decoding is tested with the multimodal models."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from chat.engine.content import engine_messages
from chat.engine.errors import InvalidMediaError, UnsupportedMediaError
from modalities.parts import MediaInput
from tests.chat.engine.fakes import FakeRuntime


def png_url(corrupt: bool = False) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, format="PNG")
    data = buf.getvalue()
    if corrupt:
        data = data[: len(data) // 2]
    return "data:image/png;base64," + base64.b64encode(data).decode()


def message(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is "},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "this?"},
            ],
        }
    ]


def test_text_parts_are_joined_and_developer_becomes_system():
    out = engine_messages(
        [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
        FakeRuntime(),
    )
    assert out == [{"role": "system", "content": "rules"}, {"role": "user", "content": "ab"}]


def test_a_model_without_the_modality_refuses_the_item_by_name():
    with pytest.raises(UnsupportedMediaError) as err:
        engine_messages(message(png_url()), FakeRuntime())
    assert err.value.item == "messages[0].content[1]" and "image" in str(err.value)


def test_media_is_unpacked_in_place_for_a_model_with_the_modality():
    runtime = FakeRuntime()
    runtime.modalities = frozenset({"image"})
    url = png_url()
    [out] = engine_messages(message(url), runtime)
    text_a, part, text_b = out["content"]
    assert text_a == {"type": "text", "text": "what is "} and text_b == {"type": "text", "text": "this?"}
    assert isinstance(part, MediaInput) and part.kind == "image" and part.declared == "image/png"
    assert part.data == base64.b64decode(url.split(",")[1]) and part.item == "messages[0].content[1]"


def test_unreadable_payloads_are_refused_by_name_before_the_engine():
    runtime = FakeRuntime()
    runtime.modalities = frozenset({"image", "audio"})
    with pytest.raises(InvalidMediaError) as err:
        engine_messages(message("https://example.com/cat.png"), runtime)  # never fetched
    assert err.value.item == "messages[0].content[1]"
    with pytest.raises(InvalidMediaError):
        engine_messages(message("data:image/png;base64,@@@not base64@@@"), runtime)
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"format": "wav"}}]}]
    with pytest.raises(InvalidMediaError) as err:
        engine_messages(audio, runtime)  # no data
    assert err.value.item == "messages[0].content[0]"
