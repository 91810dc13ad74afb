"""The HTTP guard: the body-size check and the API key, before any route runs.

A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware`` (``@app.middleware("http")``): that one passes
every chunk of a streamed response through a memory stream and a task of its own, a cost per server-sent event that
``turncache bench http`` showed at 32 streams. ``create_app`` puts it in front of FastAPI's whole stack
(``chat.server.app.GuardedApp``), so that a refused request runs nothing else. Here a request is checked once and then
handed on untouched: the response's chunks go straight from the route to the server.

Checks, in order: a ``content-length`` that is not a number or over the body limit is ``too_large``; a path under
``/v1/`` (or ``/metrics``, ``/tokenize``, ``/detokenize``) needs a known key (``unauthorized``; ``Authorization:
Bearer``, or ``x-api-key`` as Anthropic's clients send it), and its
tenant is put in the request's state (``request.state.tenant``); a ``POST`` to a route that starts turns
(:data:`GENERATING`) from a tenant that is over one of its limits already is refused by ``admit_early`` (429
``rate_limited``) before its body is read: a client flooding the server past its limits costs it the headers'
parsing and a refusal, not a JSON body parsed and validated per request (``turncache bench http``'s bad clients).
The route still admits each request itself (its number of turns is in the body). WebSocket and lifespan scopes pass
through (the WebSocket checks its key itself, ``chat/server/surfaces/ws.py``).

**Refusals held.** A refusal of ``admit_early`` goes out after ``refusal_hold_s`` (or the refusal's own retry time,
if shorter): the same 429, its ``Retry-After`` counted from the answer (the hold taken off, so it may be 0). A
client that honours ``Retry-After`` waits as long as without the hold; one that ignores it and sends again at once
on its kept-alive connection sends one request a hold instead of as many as the server can refuse, each of which
costs the server's loop (and the cores the engine uses) about 0.7 ms (docs/benchmarks.md). At most ``max_held``
answers wait at once (a flood over many connections is then refused at once, as before), each a sleeping coroutine
and its connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from starlette.requests import Request

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.tenancy.auth import bearer_of
from chat.server.tenancy.ratelimit import RateLimitedError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
PROTECTED = ("/metrics", "/tokenize", "/detokenize")  # besides everything under /v1/
GENERATING = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
)  # POST routes that start turns
MAX_HELD_REFUSALS = 256  # refusals held at once (see Refusals held); beyond, they go out at once


def credential_of(headers) -> str | None:
    """The key a request presents: ``Authorization: Bearer``, else Anthropic's ``x-api-key``."""
    given = bearer_of(headers.get("authorization"))
    return given if given is not None else headers.get("x-api-key")


class GuardMiddleware:
    def __init__(
        self,
        app,
        *,
        authenticate: Callable[[str | None], Any],
        max_body: int,
        refuse,
        admit_early: Callable[[Any], RateLimitedError | None] | None = None,
        refusal_hold_s: float = 0.0,
        max_held: int = MAX_HELD_REFUSALS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.app = app
        self.authenticate = authenticate  # bearer token (or None) -> tenant, or None when unknown
        self.max_body = max_body  # bytes
        self.refuse = refuse  # exception -> ASGI response
        self.admit_early = admit_early  # tenant -> why a request of it that starts turns is refused now, or None
        self.refusal_hold_s = refusal_hold_s  # how long admit_early's refusals wait at most (0: not at all)
        self.max_held = max_held  # refusals waiting at once, at most
        self.held = 0  # refusals waiting now
        self._sleep = sleep

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
            tenant = self.authenticate(credential_of(request.headers))
            if tenant is None:
                await self.refuse(RequestError(ErrorCode.UNAUTHORIZED, "missing or wrong bearer token"))(
                    scope, receive, send
                )
                return
            request.state.tenant = tenant  # scope["state"]: the route's Request sees it
            if self.admit_early is not None and scope["method"] == "POST" and path in GENERATING:
                refusal = self.admit_early(tenant)
                if refusal is not None:
                    refusal = await self._hold(refusal)
                    await self.refuse(refusal)(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _hold(self, refusal: RateLimitedError) -> RateLimitedError:
        """Wait before answering ``refusal`` (see Refusals held), unless ``max_held`` answers wait already; the
        refusal to send, its retry time counted from the answer."""
        if self.refusal_hold_s <= 0 or self.held >= self.max_held:
            return refusal
        wait = min(self.refusal_hold_s, refusal.refusal.retry_after_s)
        self.held += 1
        try:
            await self._sleep(wait)
        finally:
            self.held -= 1
        return RateLimitedError(replace(refusal.refusal, held_s=wait))
