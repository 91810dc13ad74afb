"""Per-tenant limits end to end on a live server: the keys file's values over the server's defaults, HTTP 429 with
Retry-After in OpenAI's error shape, the WebSocket's ``rate_limited`` event that leaves the session as it was, and one
tenant's limits never touching another's."""

from __future__ import annotations

import asyncio
import json

import httpx
from websockets.asyncio.client import connect

from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url
from tests.chat.server.test_tenants import KEY_A, KEY_B, as_

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Clock:
    """Stands in for time.monotonic in the server's limiter."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limited_server(tmp_path, alice: str, **settings):
    """A server whose keys file gives alice the values ``alice`` (line format) and bob none; its limiter's clock is
    returned to be moved by hand."""
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n{KEY_B} bob\ntenant alice {alice}\n")
    engine, srv = make_server(api_keys_file=str(path), **settings)
    clock = Clock()
    srv.app.state.gate.limiter.clock = clock
    return engine, srv, clock


def post(srv, key: str, path: str = "/v1/chat/completions", **body) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{srv.url}{path}", json=body or BODY, headers=headers, timeout=30)


def test_requests_over_the_minute_get_429_with_retry_after_and_other_tenants_go_on(tmp_path):
    engine, srv, clock = limited_server(tmp_path, "requests_per_minute=2")
    with srv:
        assert post(srv, KEY_A).status_code == 200
        clock.now += 15
        completion = {"prompt": "hello", "max_tokens": 2}
        assert post(srv, KEY_A, "/v1/completions", **completion).status_code == 200  # both routes count
        clock.now += 5
        refused = post(srv, KEY_A)
        assert refused.status_code == 429
        # the first request leaves the window 40 s from now; the answer was held 1 s (--refusal-hold-s): 39 s after it
        assert refused.headers["retry-after"] == "39"
        error = refused.json()["error"]
        assert (error["code"], error["type"], error["param"]) == ("rate_limited", "rate_limit_error", None)
        assert "requests per minute is 2" in error["message"]
        assert post(srv, KEY_A, "/v1/completions", **completion).status_code == 429
        assert all(post(srv, KEY_B).status_code == 200 for _ in range(3))  # bob has no limit
        clock.now += 40
        assert post(srv, KEY_A).status_code == 200  # Retry-After later, admitted
    engine.close()


def test_a_tenant_over_its_limit_is_refused_before_its_body_is_parsed_and_counted_once(tmp_path):
    engine, srv, clock = limited_server(tmp_path, "requests_per_minute=1")
    with srv:
        assert post(srv, KEY_A).status_code == 200
        assert post(srv, KEY_B, messages=[]).status_code == 400  # a body that fails validation: 400 within limits
        refused = post(srv, KEY_A, messages=[])  # over the limit: refused before the body is looked at
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
        assert post(srv, KEY_A, "/v1/completions", prompt="x").status_code == 429
        assert httpx.get(f"{srv.url}/v1/models", headers={"authorization": f"Bearer {KEY_A}"}).status_code == 200
        assert srv.app.state.gate.figures_of("alice").rate_limited == 2  # each refusal counted once
        clock.now += 60
        assert post(srv, KEY_A, messages=[]).status_code == 400  # within its limit again: the body is checked
    engine.close()


def test_concurrent_turns_and_a_request_that_alone_needs_more(tmp_path):
    engine, srv, _ = limited_server(tmp_path, "concurrent_turns=2")
    engine.runtime.script = lambda prompt: "word " * 40
    engine.runtime.delay_s = 0.01
    with srv:
        headers = {"authorization": f"Bearer {KEY_A}"}
        with httpx.Client(timeout=30) as client:
            body = {**BODY, "max_tokens": 100, "stream": True, "n": 2}
            with client.stream("POST", f"{srv.url}/v1/chat/completions", json=body, headers=headers) as running:
                assert running.status_code == 200
                lines = running.iter_lines()  # kept: a dropped iterator closes the stream
                next(lines)  # two turns of alice run
                refused = post(srv, KEY_A)
                assert refused.status_code == 429  # held its 1 s retry time (--refusal-hold-s 1): retry now
                assert refused.headers["retry-after"] == "0"
                assert "concurrent turns is 2" in refused.json()["error"]["message"]
                assert post(srv, KEY_B).status_code == 200
                list(lines)
        assert post(srv, KEY_A, n=2, **BODY).status_code == 200  # both turns ended: room again
        too_many = post(srv, KEY_A, n=3, **BODY)
        assert too_many.status_code == 400  # waiting would never help: not a 429
        assert too_many.json()["error"]["param"] == "n"
    engine.close()


def test_tokens_per_minute_count_prompt_and_completion_tokens_of_ended_turns(tmp_path):
    engine, srv, clock = limited_server(tmp_path, "tokens_per_minute=20")
    with srv:
        first = post(srv, KEY_A)
        assert first.status_code == 200 and first.json()["usage"]["total_tokens"] < 20
        second = post(srv, KEY_A, messages=[{"role": "user", "content": "a longer question " * 3}], max_tokens=4)
        assert second.status_code == 200  # admitted under the limit; its tokens take the tenant over
        refused = post(srv, KEY_A)
        assert refused.status_code == 429 and "tokens per minute is 20" in refused.json()["error"]["message"]
        assert post(srv, KEY_B).status_code == 200
        clock.now += 60
        assert post(srv, KEY_A).status_code == 200
    engine.close()


def test_server_defaults_apply_where_the_keys_file_says_nothing_and_none_lifts_them(tmp_path):
    engine, srv, _ = limited_server(tmp_path, "requests_per_minute=none", tenant_requests_per_minute=1)
    with srv:
        assert post(srv, KEY_B).status_code == 200
        assert post(srv, KEY_B).status_code == 429  # bob: the server's default
        assert all(post(srv, KEY_A).status_code == 200 for _ in range(3))  # alice: none, no limit
    engine.close()


def test_a_refused_websocket_turn_gets_rate_limited_and_the_session_stays_usable(tmp_path):
    engine, srv, clock = limited_server(tmp_path, "requests_per_minute=1")
    with srv:

        async def scenario() -> None:
            async with connect(ws_url(srv), **as_(KEY_A)) as ws:
                c = Client(ws)
                await c.send(type="session.create", system="be brief")
                await c.until("session.created")
                first = await c.turn("first question")
                await c.send(type="turn.create", content="second question", event_id="over")
                error = await c.recv()  # the very next event: no turn.started came first
                assert error["type"] == "error" and error["code"] == "rate_limited" and error["reply_to"] == "over"
                assert "turn_id" not in error or error["turn_id"] is None
                await c.send(type="conversation.get")
                conversation, _ = await c.until("conversation")
                assert [m["content"] for m in conversation["messages"]] == ["first question", first["text"]]
                clock.now += 60
                again = await c.turn("second question")  # the same socket and session, a minute later
                assert again["finish_reason"] == "stop"
                await c.send(type="conversation.get")
                conversation, _ = await c.until("conversation")
                assert len(conversation["messages"]) == 4

        asyncio.run(scenario())
    engine.close()


def test_a_tenant_at_its_open_sessions_pushes_out_only_its_own(tmp_path):
    engine, srv, _ = limited_server(tmp_path, "open_sessions=2")
    with srv:

        async def session(key: str) -> str:
            async with connect(ws_url(srv), **as_(key)) as ws:
                c = Client(ws)
                await c.send(type="session.create")
                created, _ = await c.until("session.created")
                return created["session"]["id"]

        async def resumes(key: str, session_id: str) -> bool:
            async with connect(ws_url(srv), **as_(key)) as ws:
                await ws.send(json.dumps({"type": "session.resume", "session_id": session_id}))
                return json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.resumed"

        async def scenario() -> None:
            bobs = await session(KEY_B)
            alices = [await session(KEY_A) for _ in range(3)]
            assert not await resumes(KEY_A, alices[0])  # her oldest made room for her third
            assert await resumes(KEY_A, alices[1]) and await resumes(KEY_A, alices[2])
            assert await resumes(KEY_B, bobs)  # never another tenant's

        asyncio.run(scenario())
    engine.close()


def test_a_priority_out_of_range_is_refused_naming_it(tmp_path):
    engine, srv, _ = limited_server(tmp_path, "priority=5")
    with srv:
        for path, body in (("/v1/chat/completions", BODY), ("/v1/completions", {"prompt": "x", "max_tokens": 2})):
            for priority in (101, -101):
                refused = post(srv, KEY_A, path, **body, priority=priority)
                assert refused.status_code == 400, refused.text
                error = refused.json()["error"]
                assert error["param"] == "priority" and "priority" in error["message"]
            assert post(srv, KEY_A, path, **body, priority=-100).status_code == 200

        async def scenario() -> dict:
            async with connect(ws_url(srv), **as_(KEY_A)) as ws:
                c = Client(ws)
                await c.send(type="session.create", sampling={"priority": 1000}, event_id="p")
                return await c.recv()

        error = asyncio.run(scenario())
        assert error["code"] == "invalid_event" and "priority" in error["message"]
    engine.close()


def test_priorities_reach_the_engine_from_the_request_else_the_tenants_default(tmp_path):
    engine, srv, _ = limited_server(tmp_path, "priority=5", tenant_priority=-2)
    seen: list[int | None] = []
    submit = engine.submit
    engine.submit = lambda request, sink: (seen.append(request.params.priority), submit(request, sink))[1]
    with srv:
        post(srv, KEY_A)
        post(srv, KEY_A, **BODY, priority=-3)
        post(srv, KEY_A, "/v1/completions", prompt="x", max_tokens=2, priority=9)
        post(srv, KEY_B)  # no value in the keys file: the server's default

        async def scenario() -> None:
            async with connect(ws_url(srv), **as_(KEY_A)) as ws:
                c = Client(ws)
                await c.send(type="session.create", sampling={"priority": 7})
                await c.until("session.created")
                await c.turn("session's priority")
                await c.send(type="turn.create", content="this turn's", sampling={"priority": -100})
                await c.until("reply.done")
                await c.send(type="completion.create", messages=[{"role": "user", "content": "x"}])
                await c.until("reply.done")

        asyncio.run(scenario())
    engine.close()
    assert seen == [5, -3, 9, -2, 7, -100, 5]
