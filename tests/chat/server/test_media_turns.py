"""Media over the live WebSocket on a real multimodal model: a session's image turns hit the prefix cache, and an
image sent again is not encoded again."""

from __future__ import annotations

import asyncio
import base64

import pytest
import torch
from websockets.asyncio.client import connect

from chat.models import load_model
from tests.chat.models.mm_helpers import png, wav
from tests.chat.server.conftest import make_server
from tests.chat.server.test_ws import Client, ws_url


@pytest.fixture(scope="module")
def omni():
    torch.set_num_threads(1)
    runtime = load_model("tiny-omni")
    engine, srv = make_server(runtime=runtime)
    with srv:
        yield srv, runtime
    engine.close()


def image_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def audio_part(data: bytes) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


def test_image_turns_hit_the_cache_and_repeats_are_not_encoded(omni):
    srv, runtime = omni

    async def scenario():
        async with connect(ws_url(srv), max_size=None) as ws:
            c = Client(ws)
            await c.send(type="session.create", system="be brief", sampling={"max_tokens": 4})
            await c.until("session.created")
            dones = []
            for content in (
                [{"type": "text", "text": "what is this?"}, image_part(png(21))],
                [{"type": "text", "text": "and this sound?"}, audio_part(wav())],
                [image_part(png(21)), {"type": "text", "text": "the first one again"}],
            ):
                await c.send(type="turn.create", content=content)
                done, _ = await c.until("reply.done")
                dones.append(done)
            return dones

    encoded_before = runtime.media_counters["encoded"]
    dones = asyncio.run(scenario())
    assert all(d["finish_reason"] in ("stop", "length") for d in dones), dones
    cached = [d["usage"]["prompt_tokens_details"]["cached_tokens"] for d in dones]
    prompts = [d["usage"]["prompt_tokens"] for d in dones]
    assert cached[0] == 0 and 0 < cached[1] < prompts[1] and cached[1] < cached[2] < prompts[2]
    assert runtime.media_counters["encoded"] - encoded_before == 2  # the image once, the clip once
