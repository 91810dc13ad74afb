"""The proxy's guard: a stream whose ingress died ends with a typed error; other streams pass untouched."""

import asyncio
import json

from chat.cluster.launch import PROXY_CALLBACK, proxy_environment
from chat.cluster.proxy_guard import SERVICE_RESTART, IngressLossGuard, middlewares
from chat.protocol.errors import ErrorCode
from chat.server.errors import TRANSPORT


def drive(app, scope_type: str, incoming=()):
    """Run ``app`` behind the guard; return what it sent."""
    sent, queue = [], list(incoming)

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(IngressLossGuard(app)({"type": scope_type}, receive, send))
    return sent


def test_a_websocket_left_open_by_a_dead_ingress_gets_an_unavailable_error_then_1012():
    async def dies(scope, receive, send):  # what Ray Serve's proxy does when the ingress dies: returns, no close
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": '{"type": "reply.delta"}'})

    sent = drive(dies, "websocket")
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.send", "websocket.close"]
    event = json.loads(sent[2]["text"])
    assert event["type"] == "error" and event["code"] == "unavailable" and "session.resume" in event["message"]
    assert sent[3]["code"] == SERVICE_RESTART


def test_a_websocket_closed_by_its_ingress_or_its_client_is_left_alone():
    async def closes(scope, receive, send):
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    assert [m["type"] for m in drive(closes, "websocket")] == ["websocket.accept", "websocket.close"]

    async def client_left(scope, receive, send):
        await send({"type": "websocket.accept"})
        await receive()

    sent = drive(client_left, "websocket", [{"type": "websocket.disconnect", "code": 1001}])
    assert [m["type"] for m in sent] == ["websocket.accept"]


def test_an_event_stream_cut_by_a_dead_ingress_ends_with_an_error_chunk_and_done():
    async def dies(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

    sent = drive(dies, "http")
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last["more_body"]
    chunk, done = last["body"].decode().strip().split("\n\n")
    error = json.loads(chunk.removeprefix("data: "))["error"]
    assert error["code"] == "unavailable" and error["type"] == TRANSPORT[ErrorCode.UNAVAILABLE].kind
    assert done == "data: [DONE]"


def test_finished_responses_are_left_alone():
    async def fine(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    assert len(drive(fine, "http")) == 2

    async def json_cut(scope, receive, send):  # not a stream: Ray Serve's own answer stands
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})

    assert len(drive(json_cut, "http")) == 1


def test_ray_finds_the_guard_by_the_import_path_a_local_ray_is_given():
    from ray.serve._private.http_util import validate_http_proxy_callback_return

    env = proxy_environment()
    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == PROXY_CALLBACK == "chat.cluster.proxy_guard.middlewares"
    (middleware,) = validate_http_proxy_callback_return(middlewares())
    assert middleware.cls is IngressLossGuard
