"""AsyncChatClient against the real server on a fake engine (loopback), and against scripted stand-ins."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from PIL import Image as PILImage

from chat.tools.client import (
    AsyncChatClient,
    Audio,
    BusyError,
    ChatConnectionError,
    ChatError,
    ChatTimeout,
    ConnectFailed,
    ConnectionLost,
    InvalidMediaError,
    InvalidRequestError,
    SessionError,
    UnexpectedServerEvent,
)
from tests.chat.tools.client.helpers import drop_on_turn, fake_server, free_port, scripted_server, session_created


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


@pytest.fixture
def server():
    with fake_server() as (engine, url):
        yield engine, url


def test_multi_turn_session_streams_and_cached_tokens_rise(server):
    _, url = server

    async def scenario():
        async with AsyncChatClient(url) as client:
            info = await client.create_session(system="be brief", sampling={"max_tokens": 64})
            assert info.system == "be brief" and info.sampling.max_tokens == 64 and client.session == info
            replies = [await client.send(text) for text in ("hello", "more")]
            stream = client.send("again")
            deltas = [d async for d in stream]
            replies.append(stream.reply)
            assert "".join(deltas) == stream.reply.text and len(deltas) > 1
            assert stream.turn_id == stream.reply.turn_id and stream.started.kind == "create"
            assert await stream is stream.reply  # awaiting a consumed stream returns its reply
            conversation = await client.conversation()
            return replies, conversation

    replies, conversation = run(scenario())
    cached = [r.cached_tokens for r in replies]
    assert cached[0] < cached[1] < cached[2]
    assert all(r.finish_reason == "stop" and r.ttft_ms is not None and r.message_id for r in replies)
    assert all(r.prompt_tokens > r.cached_tokens and r.completion_tokens > 0 for r in replies)
    assert [m.content for m in conversation.messages] == ["hello", replies[0].text, "more", replies[1].text,
                                                          "again", replies[2].text]  # fmt: skip


def test_stateless_completion_hits_the_cache(server):
    _, url = server

    async def scenario():
        async with AsyncChatClient(url) as client:  # no session needed
            messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "stateless hello"}]
            first = await client.complete(messages, sampling={"max_tokens": 32})
            messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "next"}]
            second = await client.complete(messages)
            return first, second

    first, second = run(scenario())
    assert first.message_id is None and first.text
    assert second.cached_tokens > first.prompt_tokens - 2


def test_regenerate_edit_and_resume(server):
    _, url = server

    async def scenario():
        async with AsyncChatClient(url) as client:
            session = await client.create_session()
            await client.send("first question")
            await client.send("second question")
            regen = await client.regenerate()
            edited = await client.edit("edited question", index=0)
            conv = await client.conversation()
        async with AsyncChatClient(url) as other:
            resumed = await other.resume_session(session.id)
            updated = await other.update_session(system="new system", sampling={"temperature": 0.5})
            removed = await other.update_session(system=None)
        return regen, edited, conv, resumed, updated, removed

    regen, edited, conv, resumed, updated, removed = run(scenario())
    assert regen.cached_tokens == regen.prompt_tokens - 1
    assert [m.content for m in conv.messages] == ["edited question", edited.text]
    assert resumed.messages == 2
    assert updated.system == "new system" and updated.sampling.temperature == 0.5
    assert removed.system is None and removed.sampling.temperature == 0.5


def test_cancel_mid_stream_then_busy_is_gone():
    with fake_server() as (engine, url):
        engine.runtime.script = lambda p: "word " * 200
        engine.runtime.delay_s = 0.005

        async def scenario():
            async with AsyncChatClient(url) as client:
                await client.create_session()
                stream = client.send("long")
                deltas = aiter(stream)
                await anext(deltas)
                with pytest.raises(BusyError) as busy:
                    await client.send("another")
                await stream.cancel()
                _ = [d async for d in deltas]
                assert stream.reply.finish_reason == "cancelled"
                assert 0 < len(stream.reply.text) < len("word " * 200)
                await client.cancel()  # nothing runs: harmless
                after = await client.send("ok now")
                return busy.value, after

        busy, after = run(scenario())
        assert busy.code == "busy" and busy.turn_id is None and busy.reply is None
        assert after.finish_reason in ("stop", "length")


def test_server_errors_arrive_as_typed_exceptions(server):
    _, url = server

    async def scenario():
        async with AsyncChatClient(url) as client:
            with pytest.raises(SessionError) as no_session:
                await client.send("hi")
            with pytest.raises(SessionError) as unknown:
                await client.resume_session("sess_nope")
            with pytest.raises(SessionError):
                await client.create_session(model="no-such-model")
            with pytest.raises(InvalidRequestError) as invalid:
                await client.create_session(sampling={"temperature": 99})
            await client.create_session()
            with pytest.raises(InvalidRequestError):
                await client.regenerate()  # nothing to regenerate
            with pytest.raises(InvalidRequestError):
                await client.edit("x", index=5)
            await client.ping()  # the connection is still usable
            return no_session.value, unknown.value, invalid.value

    no_session, unknown, invalid = run(scenario())
    assert no_session.code == "no_session" and unknown.code == "unknown_session"
    assert invalid.code == "invalid_event" and "sampling.temperature" in invalid.message
    assert isinstance(invalid, ChatError)


def test_media_to_a_text_only_model_is_invalid_media_for_the_turn(server, tmp_path):
    _, url = server
    image_path = tmp_path / "dot.png"
    PILImage.new("RGB", (4, 4), "red").save(image_path)

    async def scenario():
        async with AsyncChatClient(url) as client:
            await client.create_session()
            failures = []
            for item in (image_path, PILImage.new("RGB", (2, 2)), Audio(np.zeros(800), sample_rate=8000)):
                with pytest.raises(InvalidMediaError) as failed:
                    await client.send("what is this?", item)
                failures.append(failed.value)
            with pytest.raises(InvalidMediaError) as malformed:  # refused by the protocol layer: no turn
                await client.send("x", {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}})
            reply = await client.send("text still works")
            conv = await client.conversation()
            return failures, malformed.value, reply, conv

    failures, malformed, reply, conv = run(scenario())
    assert [f.message.split()[-2] for f in failures] == ["image", "image", "audio"]  # "... accept <kind> input"
    assert all(f.turn_id and f.reply is not None and f.reply.finish_reason == "error" for f in failures)
    assert malformed.turn_id is None and malformed.reply is None and "content.1.image_url.url" in malformed.message
    assert reply.text and [m.content for m in conv.messages] == ["text still works", reply.text]


def test_the_server_receives_openai_shaped_parts():
    def respond(event):
        if event["type"] == "session.create":
            return session_created(event)
        return [{"type": "error", "reply_to": event["event_id"], "code": "invalid_media", "message": "recorded"}]

    with scripted_server(respond) as (url, frames):

        async def scenario():
            async with AsyncChatClient(url) as client:
                await client.create_session(system="sys", sampling={"seed": 3})
                with pytest.raises(InvalidMediaError):
                    await client.send("hi", PILImage.new("RGB", (2, 2)), Audio(np.zeros(80), sample_rate=8000))
                with pytest.raises(InvalidMediaError):
                    await client.complete([{"role": "user", "content": ["look", PILImage.new("RGB", (2, 2))]}])
                with pytest.raises(InvalidMediaError):
                    await client.edit("new", message_id="msg_1")

        run(scenario())
    create, turn, completion, edit = frames
    assert create == {"type": "session.create", "event_id": create["event_id"], "system": "sys",
                      "sampling": {"seed": 3}}  # fmt: skip
    text, image, audio = turn["content"]
    assert turn["type"] == "turn.create" and text == {"type": "text", "text": "hi"}
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert audio["input_audio"]["format"] == "wav" and base64.b64decode(audio["input_audio"]["data"])[:4] == b"RIFF"
    assert completion["messages"][0]["content"][1]["type"] == "image_url"
    assert edit == {"type": "turn.edit", "event_id": edit["event_id"], "message_id": "msg_1", "content": "new"}
    assert len({f["event_id"] for f in frames}) == 4


def test_connection_refused_is_connect_failed():
    async def scenario():
        with pytest.raises(ConnectFailed) as failed:
            await AsyncChatClient(f"ws://127.0.0.1:{free_port()}/v1/ws", open_timeout=5).connect()
        return failed.value

    assert run(scenario()).status is None


def test_a_dropped_connection_is_connection_lost_for_every_waiting_and_later_call():
    with scripted_server(drop_on_turn) as (url, _):

        async def scenario():
            async with AsyncChatClient(url) as client:
                await client.create_session()
                with pytest.raises(ConnectionLost) as lost:
                    await client.send("hi")
                with pytest.raises(ConnectionLost):
                    await client.ping()
                return lost.value

        assert run(scenario()).close_code == 1011


def test_a_frame_that_is_no_server_event_is_unexpected():
    with scripted_server(lambda event: [{"type": "nonsense"}]) as (url, _):

        async def scenario():
            async with AsyncChatClient(url) as client:
                with pytest.raises(UnexpectedServerEvent):
                    await client.ping()

        run(scenario())


def test_silence_times_out():
    with scripted_server(lambda event: []) as (url, _):

        async def scenario():
            async with AsyncChatClient(url, timeout=0.3) as client:
                with pytest.raises(ChatTimeout):
                    await client.ping()
                with pytest.raises(ChatConnectionError):  # the client is closed after a timeout
                    await client.ping()

        run(scenario())


def test_bearer_token():
    with fake_server(auth_token="tok") as (_, url):

        async def scenario():
            with pytest.raises(ConnectFailed) as refused:
                await AsyncChatClient(url).connect()
            with pytest.raises(ConnectFailed):
                await AsyncChatClient(url, token="wrong").connect()
            async with AsyncChatClient(url, token="tok") as client:
                await client.ping()
            return refused.value

        assert run(scenario()).status == 403


def test_a_frame_over_the_limit_is_refused_locally(server):
    _, url = server

    async def scenario():
        async with AsyncChatClient(url) as client:
            await client.create_session()
            with pytest.raises(InvalidRequestError) as too_large:
                await client.send("x" * (17 * 1024 * 1024))
            await client.ping()
            return too_large.value

    assert run(scenario()).code == "frame_too_large"
