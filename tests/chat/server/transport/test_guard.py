"""The HTTP guard checks a request once and hands the route the server's own ``send`` (a streamed response's chunks
go straight out, through no memory stream or task of the guard's), refusing bad keys and bodies before any route."""

import asyncio

from fastapi.responses import JSONResponse

from chat.server.tenancy.ratelimit import RateLimitedError, Refusal
from chat.server.transport.guard import GuardMiddleware


def _run(headers: dict[str, str], path: str = "/v1/chat/completions", method: str = "POST", admit_early=None):
    seen = {}

    async def route(scope, receive, send):
        seen["send"], seen["tenant"] = send, scope.get("state", {}).get("tenant")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def refuse(exc):
        return JSONResponse({"error": str(exc)}, status_code=400)

    guard = GuardMiddleware(
        route, authenticate={"k1": "tenant-1"}.get, max_body=1024, refuse=refuse, admit_early=admit_early
    )
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": raw, "query_string": b""}
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        seen["body read"] = True
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(guard(scope, receive, send))
    return seen, sent, send


def test_a_known_key_reaches_the_route_with_its_tenant_and_the_servers_own_send():
    seen, sent, send = _run({"authorization": "Bearer k1"})
    assert seen["send"] is send and seen["tenant"] == "tenant-1"
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_a_missing_key_or_an_oversized_body_is_refused_before_the_route():
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Bearer k1", "content-length": "4096"}):
        seen, sent, _ = _run(headers)
        assert seen == {} and sent[0]["status"] == 400


def test_paths_outside_the_api_need_no_key():
    seen, _, send = _run({}, path="/health")
    assert seen["send"] is send and seen["tenant"] is None


def test_a_request_that_starts_turns_from_a_tenant_over_its_limits_is_refused_before_its_body_is_read():
    asked = []

    def over_limit(tenant):
        asked.append(tenant)
        return RateLimitedError(Refusal("requests_per_minute", 1, 30.0))

    key = {"authorization": "Bearer k1"}
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        seen, sent, _ = _run(key, path=path, admit_early=over_limit)
        assert seen == {} and sent[0]["status"] == 400  # refused: no route, no body read
    assert asked == ["tenant-1"] * 3
    for path, method in (("/v1/models", "GET"), ("/v1/responses/abc", "GET"), ("/tokenize", "POST")):
        seen, sent, _ = _run(key, path=path, method=method, admit_early=over_limit)
        assert seen["tenant"] == "tenant-1" and sent[0]["status"] == 200  # nothing that starts a turn: untouched
    assert len(asked) == 3
    seen, sent, _ = _run(key, admit_early=lambda tenant: None)  # within its limits: the route runs
    assert seen["tenant"] == "tenant-1" and sent[0]["status"] == 200


def test_the_apps_guard_refuses_before_fastapis_own_stack_and_lets_the_rest_through_it(monkeypatch):
    """create_app puts the guard in front of FastAPI's stack: a refused request never enters it (a flood past its
    limit costs the guard and the refusal only), an admitted one goes through it to its route."""
    import json

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from tests.chat.server.conftest import make_server

    entered = []
    stack = FastAPI.__call__

    async def counting(self, scope, receive, send):
        if scope["type"] == "http":
            entered.append(scope["path"])
        await stack(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", counting)
    keys = {"good-key-0123456789abcdef": "a", "tenants": {"a": {"requests_per_minute": 1}}}
    engine, srv = make_server(api_keys=json.dumps(keys), keys_poll_s=0)
    try:
        with TestClient(srv.app) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert client.post("/v1/chat/completions", json=body).status_code == 401
            assert entered == []
            good = {"authorization": "Bearer good-key-0123456789abcdef"}
            assert client.post("/v1/chat/completions", json=body, headers=good).status_code == 200
            assert entered == ["/v1/chat/completions"]
            refused = client.post("/v1/chat/completions", json=body, headers=good)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
            assert entered == ["/v1/chat/completions"]
    finally:
        engine.close()


def test_a_refusal_waits_the_hold_or_its_retry_time_if_shorter_and_at_most_max_held_wait_at_once():
    """Refusals for a tenant's limits go out after ``refusal_hold_s`` (the retry time if shorter); when ``max_held``
    wait already, the next goes out at once; with no hold, none waits."""

    async def scenario(hold_s: float, retry_s: list[float]) -> tuple[list[float], list[int]]:
        waits, release, answered, retry = [], asyncio.Event(), [], {}

        async def sleep(seconds):
            waits.append(seconds)
            await release.wait()

        def refuse(exc):
            return JSONResponse(
                {"error": str(exc)}, status_code=429, headers={"Retry-After": str(exc.refusal.retry_after)}
            )

        retries = iter(retry_s)
        guard = GuardMiddleware(
            None,
            authenticate={"k1": "tenant-1"}.get,
            max_body=1024,
            refuse=refuse,
            admit_early=lambda tenant: RateLimitedError(Refusal("requests_per_minute", 1, next(retries))),
            refusal_hold_s=hold_s,
            max_held=2,
            sleep=sleep,
        )
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "root_path": "",
            "headers": [(b"authorization", b"Bearer k1")],
            "query_string": b"",
        }

        def request(i):
            async def send(message):
                if message["type"] == "http.response.start":
                    answered.append(i)
                    retry[i] = dict(message["headers"]).get(b"retry-after")

            return guard(scope, None, send)

        tasks = [asyncio.ensure_future(request(i)) for i in range(len(retry_s))]
        await asyncio.sleep(0.05)
        early = list(answered)  # answered while the others still wait
        release.set()
        await asyncio.gather(*tasks)
        assert guard.held == 0 and sorted(answered) == list(range(len(retry_s)))
        return waits, early, retry

    waits, early, retry = asyncio.run(scenario(1.0, [30.0, 0.25, 30.0]))
    assert waits == [1.0, 0.25] and early == [2]  # two held (one for its shorter retry time), the third at once
    assert retry == {0: b"29", 1: b"0", 2: b"30"}  # Retry-After counted from the answer
    waits, early, retry = asyncio.run(scenario(0.0, [30.0, 30.0]))
    assert waits == [] and early == [0, 1] and retry == {0: b"30", 1: b"30"}


def test_the_servers_refusals_for_limits_are_held_and_a_client_that_ignores_retry_after_sends_fewer():
    """Live: with ``refusal_hold_s`` 0.3, each 429 for the tenant's limit comes 0.3 s or more after its request, so a
    client sending again at once on its connection sends about 3 a second."""
    import json
    import time

    import httpx

    from tests.chat.server.conftest import make_server

    keys = {"good-key-0123456789abcdef": "a", "tenants": {"a": {"requests_per_minute": 1}}}
    engine, srv = make_server(api_keys=json.dumps(keys), keys_poll_s=0, refusal_hold_s=0.3)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    good = {"authorization": "Bearer good-key-0123456789abcdef"}
    try:
        with srv, httpx.Client(base_url=srv.url, timeout=30) as client:
            assert srv.app.guard.refusal_hold_s == 0.3
            assert client.post("/v1/chat/completions", json=body, headers=good).status_code == 200
            for _ in range(3):
                start = time.monotonic()
                refused = client.post("/v1/chat/completions", json=body, headers=good)
                assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()
                assert time.monotonic() - start >= 0.3
            assert srv.app.guard.held == 0
    finally:
        engine.close()
