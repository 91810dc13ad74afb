"""The chat WebSocket on a real server (loopback), with the `websockets` client."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.chat.server.conftest import make_server


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/ws"


class Client:
    def __init__(self, ws):
        self.ws = ws

    async def send(self, **event):
        await self.ws.send(json.dumps(event))

    async def recv(self) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), 30))

    async def until(self, kind: str) -> tuple[dict, list[dict]]:
        seen = []
        while True:
            event = await self.recv()
            seen.append(event)
            if event["type"] == kind:
                return event, seen

    async def start_streaming(self, text: str) -> None:
        """Open a session and start a turn; return once its first delta arrived."""
        await self.send(type="session.create")
        await self.until("session.created")
        await self.send(type="turn.create", content=text)
        await self.until("reply.delta")

    async def turn(self, text: str) -> dict:
        await self.send(type="turn.create", content=text, event_id="t")
        done, seen = await self.until("reply.done")
        deltas = "".join(e["delta"] for e in seen if e["type"] == "reply.delta")
        assert deltas == done["text"]
        return done


def run(coro):
    return asyncio.run(coro)


def test_multi_turn_session_cached_tokens_rise(server):
    async def scenario():
        async with connect(ws_url(server)) as ws:
            c = Client(ws)
            await c.send(type="session.create", system="be brief", event_id="s1")
            created, _ = await c.until("session.created")
            assert created["reply_to"] == "s1"
            cached = []
            for text in ("hello", "more", "again"):
                done = await c.turn(text)
                cached.append(done["usage"]["prompt_tokens_details"]["cached_tokens"])
                assert done["finish_reason"] == "stop" and done["timings"]["ttft_ms"] is not None
            return cached

    cached = run(scenario())
    assert cached[0] < cached[1] < cached[2]


def test_edit_regenerate_and_conversation(server):
    async def scenario():
        async with connect(ws_url(server)) as ws:
            c = Client(ws)
            await c.send(type="session.create")
            await c.until("session.created")
            first = await c.turn("first question")
            await c.turn("second question")
            await c.send(type="turn.regenerate")
            regen, _ = await c.until("reply.done")
            assert regen["usage"]["prompt_tokens_details"]["cached_tokens"] == regen["usage"]["prompt_tokens"] - 1
            await c.send(type="turn.edit", index=0, content="edited question")
            edited, _ = await c.until("reply.done")
            await c.send(type="conversation.get")
            conv, _ = await c.until("conversation")
            texts = [m["content"] for m in conv["messages"]]
            assert texts == ["edited question", edited["text"]]
            assert edited["text"] != first["text"]

    run(scenario())


def test_cancel_mid_stream_and_busy():
    engine, srv = make_server()
    engine.runtime.script = lambda p: "word " * 200
    engine.runtime.delay_s = 0.005
    with srv:

        async def scenario():
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.start_streaming("long")
                await c.send(type="turn.create", content="another", event_id="b")
                busy, _ = await c.until("error")
                assert busy["code"] == "busy" and busy["reply_to"] == "b"
                await c.send(type="turn.cancel")
                done, _ = await c.until("reply.done")
                assert done["finish_reason"] == "cancelled"
                after = await c.turn("ok now")
                assert after["finish_reason"] in ("stop", "length") and after["text"]

        run(scenario())
        assert engine.cache_stats().in_use == 0
    engine.close()


def test_stateless_mode_hits_the_cache(server):
    async def scenario():
        async with connect(ws_url(server)) as ws:
            c = Client(ws)
            messages = [{"role": "user", "content": "stateless hello"}]
            await c.send(type="completion.create", messages=messages)
            first, _ = await c.until("reply.done")
            messages += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "next"}]
            await c.send(type="completion.create", messages=messages)
            second, _ = await c.until("reply.done")
            return second["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert run(scenario()) > 0


def test_two_sessions_never_see_each_other(server):
    async def scenario():
        async with connect(ws_url(server)) as a, connect(ws_url(server)) as b:
            ca, cb = Client(a), Client(b)
            await ca.send(type="session.create")
            sa, _ = await ca.until("session.created")
            await cb.send(type="session.create")
            await cb.until("session.created")
            await ca.turn("secret of session a")
            await cb.send(type="conversation.get")
            conv, _ = await cb.until("conversation")
            assert conv["messages"] == []
            await cb.send(type="turn.cancel", turn_id="turn_x", event_id="c")
            err, _ = await cb.until("error")
            assert err["code"] == "not_generating"
            return sa["session"]["id"]

    session_id = run(scenario())

    async def resume():
        async with connect(ws_url(server)) as ws:
            c = Client(ws)
            await c.send(type="session.resume", session_id=session_id)
            resumed, _ = await c.until("session.resumed")
            assert resumed["session"]["id"] == session_id and resumed["session"]["messages"] == 2
            await c.send(type="conversation.get")
            conv, _ = await c.until("conversation")
            return conv["messages"]

    messages = run(resume())
    assert messages[0]["content"] == "secret of session a"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "invalid_json"),
        (json.dumps({"type": "launch.missiles"}), "unknown_event"),
        (json.dumps({"type": "turn.create"}), "invalid_event"),
        (json.dumps({"type": "turn.create", "content": "hi", "event_id": "x"}), "no_session"),
        (json.dumps({"type": "session.resume", "session_id": "sess_nope"}), "unknown_session"),
        ("[" * 100_000 + "]" * 100_000, "invalid_json"),
        (
            json.dumps(
                {
                    "type": "completion.create",
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
                            ],
                        }
                    ],
                }
            ),
            "invalid_media",
        ),
    ],
)
def test_bad_frames_get_typed_errors_and_the_connection_stays_usable(server, frame, code):
    async def scenario():
        async with connect(ws_url(server), max_size=None) as ws:
            c = Client(ws)
            await ws.send(frame)
            error, _ = await c.until("error")
            assert error["code"] == code, error
            await c.send(type="ping", event_id="p")
            pong, _ = await c.until("pong")
            assert pong["reply_to"] == "p"

    run(scenario())


def test_a_frame_over_the_limit_closes_with_1009():
    engine, srv = make_server(max_ws_frame_mib=1)
    srv.server.config.ws_max_size = 1024 * 1024
    with srv:

        async def scenario():
            async with connect(ws_url(srv), max_size=None) as ws:
                await ws.send("x" * (2 * 1024 * 1024))
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 30)
                return closed.value.rcvd.code

        assert run(scenario()) == 1009
    engine.close()


def test_token_and_origin_are_enforced():
    engine, srv = make_server(auth_token="tok", allowed_origins=["http://good.example"])
    with srv:

        async def attempt(**kwargs) -> int | None:
            try:
                async with connect(ws_url(srv), **kwargs) as ws:
                    await ws.send(json.dumps({"type": "ping"}))
                    await asyncio.wait_for(ws.recv(), 10)
                    return None
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None
            except Exception as exc:  # refused during the handshake
                return getattr(getattr(exc, "response", None), "status_code", -1)

        auth = {"additional_headers": {"Authorization": "Bearer tok"}}
        assert run(attempt()) in (1008, 403)
        assert run(attempt(additional_headers={"Authorization": "Bearer wrong"})) in (1008, 403)
        assert run(attempt(**auth)) is None
        assert run(attempt(additional_headers={"Authorization": "Bearer tok", "Origin": "http://evil.example"})) in (
            1008,
            403,
        )
        assert run(attempt(additional_headers={"Authorization": "Bearer tok", "Origin": "http://good.example"})) is None
    engine.close()


def test_a_client_that_vanishes_mid_stream_stops_its_generation():
    engine, srv = make_server()
    engine.runtime.script = lambda p: "word " * 400
    engine.runtime.delay_s = 0.005
    with srv:

        async def scenario():
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.start_streaming("long")
            for _ in range(300):
                if engine.metrics.active == 0:
                    return True
                await asyncio.sleep(0.01)
            return False

        assert run(scenario())
        assert engine.metrics.finish_reasons.get("cancelled") == 1
        assert engine.cache_stats().in_use == 0
        assert engine.runtime.open_runs == 0
    engine.close()


def test_a_real_tiny_model_over_the_socket_gives_the_same_replies_with_and_without_the_cache():
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = load_model("tiny-qwen3next")  # hybrid: recurrent snapshots must line up with the turns
    runs = []
    for cache in (PrefixCache(), None):
        engine = Engine(runtime, cache=cache)
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as srv:

            async def scenario(srv=srv):
                async with connect(ws_url(srv)) as ws:
                    c = Client(ws)
                    await c.send(type="session.create", system="tiny", sampling={"temperature": 0.0, "max_tokens": 6})
                    await c.until("session.created")
                    return [await c.turn(text) for text in ("one two", "three four", "five six")]

            runs.append(run(scenario()))
        engine.close()
    cached, uncached = runs
    assert [d["text"] for d in cached] == [d["text"] for d in uncached]
    hits = [d["usage"]["prompt_tokens_details"]["cached_tokens"] for d in cached]
    assert hits[0] == 0 and 0 < hits[1] < hits[2]
    assert all(d["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for d in uncached)
