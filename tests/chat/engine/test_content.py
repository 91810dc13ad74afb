"""Content parts -> engine messages: text joined, media refused by models without the modality, media decoded
(and refused when corrupt) for models with it."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from chat.engine.content import engine_messages
from chat.engine.errors import InvalidMediaError, UnsupportedMediaError
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


def test_media_is_decoded_for_a_model_with_the_modality():
    runtime = FakeRuntime()
    runtime.modalities = frozenset({"image"})
    assert engine_messages(message(png_url()), runtime) == [{"role": "user", "content": "what is this?"}]
    with pytest.raises(InvalidMediaError) as err:
        engine_messages(message(png_url(corrupt=True)), runtime)
    assert err.value.item == "messages[0].content[1]"
    with pytest.raises(InvalidMediaError):
        engine_messages(message("https://example.com/cat.png"), runtime)  # never fetched
    with pytest.raises(InvalidMediaError):
        engine_messages(message("data:image/jpeg;base64," + png_url().split(",")[1]), runtime)  # mislabeled
