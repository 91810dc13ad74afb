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
from tests.chat.server.surfaces.test_ws import Client, ws_url


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


def test_each_turn_decodes_and_hashes_only_its_new_items(omni, monkeypatch):
    """The digest validation computed is kept with the stored message: turn N of a session decodes (base64) and
    hashes the bytes of its own new image only, never those of the N - 1 images before it."""
    from modalities import identity

    srv, _ = omni
    work = {"decoded": 0, "hashed": 0}  # bytes
    decode, digest = identity.decode_base64, identity.media_digest

    def counted_decode(*args, **kwargs):
        data = decode(*args, **kwargs)
        work["decoded"] += len(data)
        return data

    def counted_digest(data):
        work["hashed"] += len(data)
        return digest(data)

    monkeypatch.setattr(identity, "decode_base64", counted_decode)
    monkeypatch.setattr(identity, "media_digest", counted_digest)
    images = [png(60 + n, width=40 + 8 * n) for n in range(5)]  # all different, of growing size

    async def scenario() -> list[tuple[dict, dict]]:
        async with connect(ws_url(srv), max_size=None) as ws:
            c = Client(ws)
            await c.send(type="session.create", sampling={"max_tokens": 2})
            await c.until("session.created")
            per_turn = []
            for n, data in enumerate(images):
                work.update(decoded=0, hashed=0)
                await c.send(type="turn.create", content=[{"type": "text", "text": f"picture {n}"}, image_part(data)])
                done, _ = await c.until("reply.done")
                per_turn.append((done, dict(work)))
            return per_turn

    per_turn = asyncio.run(scenario())
    for n, (done, work_done) in enumerate(per_turn):
        assert done["finish_reason"] in ("stop", "length")
        assert n == 0 or done["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        size = len(images[n])
        assert work_done == {"decoded": 2 * size, "hashed": size}, n  # validation, then preparation; one hash
