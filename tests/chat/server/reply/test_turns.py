"""Wire -> engine, for both transports (chat/server/reply/turns.py): validated content becomes the engine's messages
without decoding or hashing media again, sampling settings convert without a second validation, and usage and
timings have one wire shape."""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image

from chat.engine.errors import UnsupportedMediaError
from chat.engine.events import Done, Timings, Usage
from chat.protocol.content import ChatMessage, PromptMessage
from chat.protocol.sampling import SamplingSettings
from chat.server.reply.turns import engine_messages, sampling_params, wire_timings, wire_usage
from chat.server.surfaces.openai_api import HttpMessage
from modalities import identity
from modalities.parts import MediaInput
from tests.chat.engine.fakes import FakeRuntime


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def user(*parts: dict) -> PromptMessage:
    message = ChatMessage.model_validate({"role": "user", "content": list(parts)})
    return PromptMessage(message.role, message.content)


TEXT_A, TEXT_B = {"type": "text", "text": "what is "}, {"type": "text", "text": "this?"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png()).decode()}}


def media_runtime() -> FakeRuntime:
    runtime = FakeRuntime()
    runtime.modalities = frozenset({"image", "audio"})
    return runtime


def test_text_parts_are_joined_and_developer_becomes_system():
    developer = HttpMessage.model_validate({"role": "developer", "content": "rules", "name": "ignored"})
    texts = user({"type": "text", "text": "a"}, {"type": "text", "text": "b"})
    out = engine_messages([developer.prompt(), texts], FakeRuntime())
    assert out == [{"role": "system", "content": "rules"}, {"role": "user", "content": "ab"}]


def test_a_model_without_the_modality_refuses_the_item_by_name():
    with pytest.raises(UnsupportedMediaError) as err:
        engine_messages([user(TEXT_A, IMAGE, TEXT_B)], FakeRuntime())
    assert err.value.item == "messages[0].content[1]" and "image" in str(err.value)


def test_media_become_inputs_carrying_the_digest_validation_computed(monkeypatch):
    message = user(TEXT_A, IMAGE, TEXT_B)  # validation decodes and hashes the image once
    calls = {"digest": 0, "decode": 0}
    digest, decode = identity.media_digest, identity.decode_base64

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(identity, "media_digest", counted("digest", digest))
    monkeypatch.setattr(identity, "decode_base64", counted("decode", decode))
    [out] = engine_messages([message], media_runtime())
    text_a, part, text_b = out["content"]
    assert calls == {"digest": 0, "decode": 0}  # nothing is decoded or hashed on the way to the engine
    assert text_a == {"type": "text", "text": "what is "} and text_b == {"type": "text", "text": "this?"}
    assert isinstance(part, MediaInput) and part.kind == "image" and part.declared == "image/png"
    assert part.digest == hashlib.sha256(png()).hexdigest() and part.item == "messages[0].content[1]"
    assert part.data == png() and calls["decode"] == 1  # the bytes are decoded only when asked for


def test_sampling_settings_become_the_engines_params():
    params = sampling_params(SamplingSettings(temperature=0.5, top_k=3, seed=9, max_tokens=7, stop="##"))
    assert (params.temperature, params.top_k, params.seed, params.max_tokens, params.stop) == (0.5, 3, 9, 7, ("##",))


def test_usage_and_timings_have_one_wire_shape():
    done = Done("hi", (1, 2), "stop", Usage(10, 4, 2), Timings(12.34567, 3.0, 20.0, 50.0))
    assert wire_usage(done).model_dump(exclude_none=True) == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert wire_timings(done).model_dump() == {
        "ttft_ms": 12.346,
        "decode_tokens_per_s": 20.0,
        "total_ms": 50.0,
        "prefill_ms": 3.0,
    }
    silent = Done("", (), "cancelled", Usage(10, 4, 0), Timings(12.0, 3.0, 0.0, 50.0))
    assert wire_timings(silent).ttft_ms is None  # no token: no time to the first one
