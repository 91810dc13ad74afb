"""Hostile or unlucky clients: path traversal, disconnect and cancel storms, tenants probing each other's cache."""

from __future__ import annotations

import asyncio
import http.client
import json
import random

import httpx
from websockets.asyncio.client import connect

from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url


def raw_get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)  # sent as written: no client-side normalisation
    response = conn.getresponse()
    return response.status, response.read()


def test_static_files_never_leave_the_web_directory(server):
    for path in (
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/..%2f..%2f..%2fetc%2fpasswd",
        "/js/../../chat/server/app.py",
        "/%2e%2e%2f%2e%2e%2fpyproject.toml",
        "//etc/passwd",
    ):
        status, body = raw_get(server.port, path)
        assert status in (400, 404), (path, status)
        assert b"root:" not in body and b"create_app" not in body and b"[project]" not in body
    assert raw_get(server.port, "/")[0] == 200


def test_a_storm_of_disconnects_and_cancels_leaves_nothing_behind():
    engine, srv = make_server()
    engine.runtime.script = lambda p: "word " * 100
    engine.runtime.delay_s = 0.002
    rng = random.Random(5)
    with srv:
        url = ws_url(srv)

        async def unlucky(i: int) -> None:
            async with connect(url) as ws:
                c = Client(ws)
                await c.send(type="session.create")
                await c.until("session.created")
                await c.send(type="turn.create", content=f"client {i}")
                action = rng.choice(["vanish_now", "vanish_mid_stream", "cancel_storm"])
                if action == "vanish_now":
                    return
                await c.until("reply.delta")
                if action == "cancel_storm":
                    for _ in range(20):
                        await c.send(type="turn.cancel")
                    await c.until("reply.done")

        async def storm() -> dict:
            await asyncio.gather(*(unlucky(i) for i in range(16)))
            for _ in range(500):
                if engine.metrics.active == 0:
                    break
                await asyncio.sleep(0.01)
            async with connect(url) as ws:  # the server still serves
                c = Client(ws)
                await c.send(type="session.create")
                await c.until("session.created")
                return await c.turn("still there?")

        done = asyncio.run(storm())
        assert done["text"]
        assert engine.metrics.active == 0 and engine.runtime.open_runs == 0
        with engine._lock:
            engine.cache.check_invariants()
            assert engine.cache.stats().in_use == 0
    engine.close()


def test_a_tenant_never_hits_another_tenants_cached_prefix(server):
    body = {"messages": [{"role": "user", "content": "a long shared prompt " * 20}], "max_tokens": 4}

    def cached(token: str) -> int:
        r = httpx.post(
            f"{server.url}/v1/chat/completions", json=body, timeout=30, headers={"authorization": f"Bearer {token}"}
        )
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0  # the same prompt, another tenant: cold
    assert cached("tenant-a") > 0  # the first tenant's own prefix is still there

    async def over_ws(token: str) -> int:
        async with connect(ws_url(server) + f"?token={token}") as ws:
            await ws.send(json.dumps({"type": "completion.create", "messages": body["messages"]}))
            c = Client(ws)
            done, _ = await c.until("reply.done")
            return done["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert asyncio.run(over_ws("tenant-c")) == 0
    assert asyncio.run(over_ws("tenant-a")) > 0


def test_a_second_tenant_does_the_same_work_as_a_cold_prompt():
    """Timing cannot leak another tenant's prefix: the model computes exactly what a cold prompt computes."""
    engine, srv = make_server()
    prompt = {"messages": [{"role": "user", "content": "a long private prompt " * 30}], "max_tokens": 3}
    with srv:

        def work(token: str) -> tuple[int, int]:
            before = engine.runtime.forwarded
            r = httpx.post(
                f"{srv.url}/v1/chat/completions", json=prompt, timeout=30, headers={"authorization": f"Bearer {token}"}
            )
            return engine.runtime.forwarded - before, r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        cold = work("tenant-a")
        other = work("tenant-b")
        again = work("tenant-a")
    engine.close()
    assert cold[1] == other[1] == 0
    assert other[0] == cold[0]  # the full prompt was computed again, as for a cold prompt
    assert again[1] > 0 and again[0] < cold[0]  # while the first tenant's own prefix is reused


def test_secrets_never_reach_the_logs(caplog):
    import logging

    secret = "s3cret-token-value"
    caplog.set_level(logging.DEBUG)
    engine, srv = make_server(auth_token=secret)

    def broken(run, token_ids, last_only=False):
        raise RuntimeError("model failure")

    with srv:
        ok = {"authorization": f"Bearer {secret}"}
        body = {"messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=ok, timeout=30).status_code == 200
        engine.runtime.forward = broken  # an internal error is logged with its details
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=ok, timeout=30).status_code == 500
        httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers={"authorization": "Bearer wrong"})

        async def over_ws():
            async with connect(ws_url(srv) + f"?token={secret}") as ws:
                c = Client(ws)
                await c.send(type="completion.create", messages=body["messages"])
                await c.until("reply.done")

        asyncio.run(over_ws())
    engine.close()
    client_side = ("websockets.client", "httpx", "httpcore")  # this test's own clients log their requests
    server_log = "\n".join(
        r.getMessage() + str(r.exc_info or "") for r in caplog.records if not r.name.startswith(client_side)
    )
    assert "request failed" in server_log  # the server's log is really captured (the 500 above)
    assert secret not in server_log
