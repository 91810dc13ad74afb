"""In Ray Serve's HTTP proxy: a stream whose ingress died ends with a typed error, not a bare cut.

The proxy outlives the ingresses it spreads connections over; when an ingress process dies, every connection it
held is left open at the proxy with nothing more to come (Ray Serve's proxy ends it without a WebSocket close frame,
or a stream without its last chunk). :class:`IngressLossGuard` wraps the proxy's ASGI app and ends such a stream as
the protocol says a failed stream ends:

- a WebSocket: an ``error`` event (code ``unavailable``, the message says to reconnect and ``session.resume``: the
  session is in the shared store, and the turn cut off is reported as ``interrupted_turn_id``), then a close with
  1012 (service restart);
- an HTTP stream of server-sent events (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` with
  ``stream``): an ``error`` chunk of that code, then ``data: [DONE]``.

A response that had not started is Ray Serve's own (a 500, or 503 while no ingress runs). Streams that ended
normally, or whose client went away, are left alone.

Ray Serve installs proxy middlewares from ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (read when the proxy starts,
in its own process): :func:`chat.cluster.launch.connect` sets it for a local Ray; on a cluster started with
``ray start``, export ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=chat.cluster.proxy_guard.middlewares`` before
``ray start`` on every node that runs a proxy (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import json

from chat.protocol.errors import ErrorCode

CALLBACK = "chat.cluster.proxy_guard.middlewares"  # the value of RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH
SERVICE_RESTART = 1012  # WebSocket close code: the server is restarting; the client may reconnect
LOST = (
    "the ingress serving this connection stopped; reconnect (another ingress takes it) and send session.resume: the "
    "conversation is intact, a turn cut off is reported as interrupted_turn_id"
)
LOST_HTTP = "the ingress serving this request stopped; send the request again"
KIND = "server_error"  # chat.server.errors.TRANSPORT[unavailable].kind (not imported: the proxy stays light)


def middlewares() -> list:
    """The proxy's middlewares (Ray Serve calls this, by import path, when a proxy starts)."""
    from starlette.middleware import Middleware

    return [Middleware(IngressLossGuard)]


class IngressLossGuard:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _websocket(self, scope, receive, send) -> None:
        seen = {"accepted": False, "closed": False, "gone": False}

        async def watched_receive():
            message = await receive()
            if message["type"] == "websocket.disconnect":
                seen["gone"] = True
            return message

        async def watched_send(message) -> None:
            if message["type"] == "websocket.accept":
                seen["accepted"] = True
            elif message["type"] == "websocket.close":
                seen["closed"] = True
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if seen["accepted"] and not seen["closed"] and not seen["gone"]:
                event = {"type": "error", "code": ErrorCode.UNAVAILABLE.value, "message": LOST}
                with contextlib.suppress(Exception):  # the client went away meanwhile: nobody to tell
                    await send({"type": "websocket.send", "text": json.dumps(event)})
                    await send({"type": "websocket.close", "code": SERVICE_RESTART, "reason": "ingress lost"})

    async def _http(self, scope, receive, send) -> None:
        seen = {"stream": False, "ended": False}

        async def watched_send(message) -> None:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                seen["stream"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["ended"] = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            if seen["stream"] and not seen["ended"]:
                code = ErrorCode.UNAVAILABLE
                error = {"message": LOST_HTTP, "type": KIND, "code": code.value, "param": None}
                body = b"data: %s\n\ndata: [DONE]\n\n" % json.dumps({"error": error}).encode()
                with contextlib.suppress(Exception):  # the client went away meanwhile: nobody to tell
                    await send({"type": "http.response.body", "body": body, "more_body": False})
