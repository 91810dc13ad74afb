"""Hostile input over the live WebSocket: crafted media, very long texts and tokens, random frames. Every case gets a
typed error, the server stays up, and a bystander session keeps working."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect

from chat.models import load_model
from chat.protocol.limits import MAX_TEXT_CHARS
from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url
from tests.modalities import helpers as media

TEN_HOURS = 36_000


def image_part(data: bytes, mime: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(data).decode()}}


def audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def video_part(data: bytes) -> dict:
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}}


@pytest.fixture(scope="module")
def media_server():
    torch.set_num_threads(1)
    engine, srv = make_server(runtime=load_model("tiny-omni"))  # takes images, audio and video
    with srv:
        yield srv
    engine.close()


@pytest.fixture(scope="module")
def text_server():
    engine, srv = make_server()
    with srv:
        yield srv
    engine.close()


CRAFTED = {
    "decompression bomb (huge declared PNG)": lambda: image_part(media.png_with_size(100_000, 100_000)),
    "truncated PNG": lambda: image_part(media.encode_image(media.picture(), "PNG")[:40]),
    "PNG bytes declared as JPEG": lambda: image_part(media.encode_image(media.picture(), "PNG"), "image/jpeg"),
    "zero-length image": lambda: image_part(b""),
    "WAV header claiming ten hours": lambda: audio_part(
        media.wav_bytes(media.pcm16(0.1), data_size=TEN_HOURS * 16_000 * 2)
    ),
    "garbage declared as MP4": lambda: video_part(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_media_gets_invalid_media_and_the_server_stays_up(media_server, case):
    part = CRAFTED[case]()

    async def scenario():
        async with connect(ws_url(media_server), max_size=None) as ws:
            c = Client(ws)
            await c.send(type="completion.create", messages=[{"role": "user", "content": [part]}])
            error, _ = await c.until("error")
            done = None
            if "turn_id" in error:  # refused while decoding: the started turn ends as failed
                done, _ = await c.until("reply.done")  # (else the parser refused it before any turn started)
            await c.send(type="completion.create", messages=[{"role": "user", "content": "after that"}])
            after, _ = await c.until("reply.done")
            return error, done, after

    error, done, after = asyncio.run(scenario())
    assert error["code"] == "invalid_media", error
    assert "content[0]" in error["message"] or "content.0" in error["message"], error  # the item is named
    assert done is None or done["finish_reason"] == "error"
    assert after["finish_reason"] in ("stop", "length")  # a random tiny model may not stop by itself


def test_very_long_texts_and_tokens_get_typed_errors(text_server):
    async def scenario():
        async with connect(ws_url(text_server), max_size=None) as ws:
            c = Client(ws)
            await c.send(type="completion.create", messages=[{"role": "user", "content": "x" * (MAX_TEXT_CHARS + 1)}])
            too_long, _ = await c.until("error")
            # within the text limit, but one enormous "word": over the model's context window
            await c.send(type="completion.create", messages=[{"role": "user", "content": "y" * 100_000}])
            overflow, _ = await c.until("error")
            await c.until("reply.done")
            return too_long, overflow

    too_long, overflow = asyncio.run(scenario())
    assert too_long["code"] == "invalid_event"
    assert overflow["code"] == "context_overflow"


frames = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=300),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    ).map(json.dumps),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                [
                    "turn.create",
                    "turn.edit",
                    "session.resume",
                    "turn.cancel",
                    "completion.create",
                    "session.update",
                    "conversation.get",
                ]
            )
        },
        optional={
            "content": st.text(max_size=20) | st.integers(),
            "index": st.integers(),
            "session_id": st.text(max_size=10),
            "messages": st.lists(st.text(max_size=5)),
        },
    ).map(json.dumps),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(batch=st.lists(frames, min_size=1, max_size=5))
def test_random_frames_never_break_the_server_or_a_bystander(text_server, batch):
    async def scenario():
        async with (
            connect(ws_url(text_server), max_size=None) as bystander,
            connect(ws_url(text_server), max_size=None) as fuzzer,
        ):
            b = Client(bystander)
            await b.send(type="session.create")
            await b.until("session.created")
            for frame in batch:
                await fuzzer.send(frame)
            await fuzzer.send(json.dumps({"type": "ping", "event_id": "alive"}))
            f = Client(fuzzer)
            while True:  # every frame was answered (or started a turn); the ping still gets its pong
                event = await f.recv()
                assert event["type"] != "error" or event["code"] != "internal", event
                if event["type"] == "pong" and event.get("reply_to") == "alive":
                    break
            done = await b.turn("are you still there?")
            assert done["finish_reason"] == "stop"

    asyncio.run(scenario())
