"""The HTTP guard: the body-size check and the API key, before any route runs.

A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``): that one passes
every chunk of a streamed response through a memory stream and a task of its own, a cost per server-sent event that
``turncache bench http`` showed at 32 streams. ``create_app`` puts it in front of FastAPI's whole stack
(``chat.server.app.GuardedApp``), so that a refused request runs nothing else. Here a request is checked once and then
handed on untouched: the response's chunks go straight from the route to the server.

Checks, in order: a ``content-length`` that is not a number or over the body limit is ``too_large``; a path under
``/v1/`` (or ``/metrics``, ``/tokenize``, ``/detokenize``) needs a known bearer key (``unauthorized``), and its
tenant is put in the request's state (``request.state.tenant``); a ``POST`` to a route that starts turns
(:data:`GENERATING`) from a tenant that is over one of its limits already is refused by ``admit_early`` (429
``rate_limited``) before its body is read: a client flooding the server past its limits costs it the headers'
parsing and a refusal, not a JSON body parsed and validated per request (``turncache bench http``'s bad clients).
The route still admits each request itself (its number of turns is in the body). WebSocket and lifespan scopes pass
through (the WebSocket checks its key itself, ``chat/server/ws.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from chat.protocol.errors import ErrorCode
from chat.server.auth import bearer_of
from chat.server.errors import RequestError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
PROTECTED = ("/metrics", "/tokenize", "/detokenize")  # besides everything under /v1/
GENERATING = ("/v1/chat/completions", "/v1/completions", "/v1/responses")  # POST routes that start turns


class GuardMiddleware:
    def __init__(
        self,
        app,
        *,
        authenticate: Callable[[str | None], Any],
        max_body: int,
        refuse,
        admit_early: Callable[[Any], BaseException | None] | None = None,
    ) -> None:
        self.app = app
        self.authenticate = authenticate  # bearer token (or None) -> tenant, or None when unknown
        self.max_body = max_body  # bytes
        self.refuse = refuse  # exception -> ASGI response
        self.admit_early = admit_early  # tenant -> why a request of it that starts turns is refused now, or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            limit = self.max_body // (1024 * 1024)
            await self.refuse(RequestError(ErrorCode.TOO_LARGE, f"request bodies are limited to {limit} MiB"))(
                scope, receive, send
            )
            return
        path = request.url.path.removeprefix(scope.get("root_path", ""))  # as routed, without a mount prefix
        if path.startswith("/v1/") or path in PROTECTED:
            tenant = self.authenticate(bearer_of(request.headers.get("authorization")))
            if tenant is None:
                await self.refuse(RequestError(ErrorCode.UNAUTHORIZED, "missing or wrong bearer token"))(
                    scope, receive, send
                )
                return
            request.state.tenant = tenant  # scope["state"]: the route's Request sees it
            if self.admit_early is not None and scope["method"] == "POST" and path in GENERATING:
                refusal = self.admit_early(tenant)
                if refusal is not None:
                    await self.refuse(refusal)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
