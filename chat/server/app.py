"""The FastAPI application: transport only. It turns HTTP (and WebSocket) traffic into engine calls and engine
results and errors back into wire responses; every decision about content lives in the engine and the protocol.

Routes: ``/`` (the web UI), ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, Anthropic's ``POST /v1/messages`` and
``/v1/messages/count_tokens``, ``POST /tokenize`` and ``/detokenize`` (as vLLM's), ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (as vLLM's; ``surfaces/lora_api.py``), and the chat WebSocket ``/v1/ws`` (see
docs/protocol.md, docs/openai.md, docs/anthropic.md). Every route that generates goes through the one reply pipeline
(``chat.server.reply``); a request's ``model`` may name a loaded LoRA adapter (``reply/adapters.py``). A base model
(no chat template) serves completions, ``/tokenize`` of a prompt and ``/detokenize``; its chat routes,
``/v1/responses``, ``/v1/messages``, ``/tokenize`` of messages and WebSocket turns answer ``no_chat_template``
(``/v1/models`` lists it with ``"chat": false``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

from chat.engine.constraints import GrammarError
from chat.engine.engine import Engine
from chat.engine.errors import EngineError
from chat.protocol.errors import ErrorCode
from chat.protocol.store import InMemorySessionStore
from chat.server.errors import RequestError, describe, validation_error
from chat.server.metrics_text import render_metrics, render_session_metrics, render_tenant_metrics
from chat.server.persistence.response_store import ResponseStore
from chat.server.persistence.session_db import SqliteSessionStore
from chat.server.reply.adapters import AdapterSelector, prepared_under
from chat.server.reply.admission import Admission
from chat.server.reply.turns import SamplingFieldError, chats, require_chat
from chat.server.settings import MiB, ServerSettings
from chat.server.surfaces import (
    anthropic_api,
    anthropic_convert,
    anthropic_types,
    completions_api,
    lora_api,
    openai_api,
    responses_api,
    tokenize_api,
)
from chat.server.surfaces.ws import serve_socket
from chat.server.tenancy.auth import KeyRing, Tenant
from chat.server.tenancy.key_store import KeyStore, watch_keys
from chat.server.tenancy.policy import TenantPolicy
from chat.server.tenancy.ratelimit import Limits, RateLimitedError
from chat.server.tenancy.tenant_gate import TenantGate
from chat.server.transport.backpressure import TimedStreamingResponse
from chat.server.transport.guard import GuardMiddleware
from chat.server.transport.media_urls import MediaURLMiddleware
from chat.server.transport.url_fetch import MediaURLPolicy

log = logging.getLogger("turncache.server")
WEB_DIR = Path(__file__).resolve().parents[2] / "web"


def key_ring(settings: ServerSettings) -> KeyRing:
    """The server's keys from its settings (see chat/server/tenancy/auth.py).

    Raises:
        KeysError: a keys source is unreadable or malformed.
    """
    token, env = settings.auth_token, settings.api_keys
    return KeyRing.from_sources(
        auth_token=token.get_secret_value() if token else None,
        keys_file=settings.api_keys_file,
        keys_env=env.get_secret_value() if env else None,
    )


def server_policy(settings: ServerSettings) -> TenantPolicy:
    """A tenant's limits and priority where its keys file says nothing (``--tenant-*``, ``TURNCACHE_TENANT_*``)."""
    limits = Limits(
        concurrent_turns=settings.tenant_concurrent_turns,
        requests_per_minute=settings.tenant_requests_per_minute,
        tokens_per_minute=settings.tenant_tokens_per_minute,
        open_sessions=settings.tenant_open_sessions,
    )
    return TenantPolicy(limits, priority=settings.tenant_priority)


def key_store(settings: ServerSettings) -> KeyStore:
    """The server's keys, read again on SIGHUP and when the keys file changes (``chat/server/tenancy/key_store.py``).

    Raises:
        KeysError: a keys source is unreadable or malformed (at start: the server must not start).
    """
    return KeyStore(key_ring(settings), lambda: key_ring(settings), settings.api_keys_file)


def session_store(settings: ServerSettings, quota=None) -> InMemorySessionStore:
    """In memory, or written through to SQLite with ``sessions_db``; ``quota(owner)``: its open sessions."""
    if settings.sessions_db:
        return SqliteSessionStore(settings.sessions_db, max_sessions=settings.max_sessions, quota=quota)
    return InMemorySessionStore(max_sessions=settings.max_sessions, quota=quota)


def media_url_policy(settings: ServerSettings) -> MediaURLPolicy:
    return MediaURLPolicy(
        hosts=tuple(settings.media_url_hosts),
        max_bytes=settings.media_url_max_bytes,
        timeout_s=settings.media_url_timeout_s,
        allow_private=settings.media_url_allow_private,
        ca_file=settings.media_url_ca_file,
    )


def error_response(exc: BaseException, path: str = "") -> JSONResponse:
    """OpenAI's error body for ``exc``, with the status of its code (``chat/server/errors.py``); Anthropic's on its
    routes (``anthropic_api.error_status_and_body``)."""
    if anthropic_api.is_anthropic(path):
        status, body = anthropic_api.error_status_and_body(exc)
        if status >= 500:
            log.error("request failed", exc_info=exc)
        headers = {"Retry-After": str(exc.refusal.retry_after)} if isinstance(exc, RateLimitedError) else None
        return JSONResponse(body, status_code=status, headers=headers)
    reported = describe(exc)
    status = reported.transport.status
    if status >= 500:
        log.error("request failed", exc_info=exc)
    error = {"message": reported.message, "type": reported.transport.kind, "code": reported.code.value}
    headers = {"Retry-After": str(exc.refusal.retry_after)} if isinstance(exc, RateLimitedError) else None
    return JSONResponse({"error": {**error, "param": reported.param}}, status_code=status, headers=headers)


def routed_path(scope) -> str:
    """A request's path as routed (without a mount prefix)."""
    return scope.get("path", "").removeprefix(scope.get("root_path", ""))


def refusal(exc: BaseException):
    """The ASGI response refusing ``exc`` in the shape of the request's surface (for the guard and middleware)."""

    async def respond(scope, receive, send) -> None:
        await error_response(exc, routed_path(scope))(scope, receive, send)

    return respond


class GuardedApp(FastAPI):
    """The app with the HTTP guard (``chat/server/transport/guard.py``) in front of FastAPI's whole stack (its telemetry
    check, Starlette's error and body-limit middleware), not inside it: a request the guard refuses (a flood past its
    tenant's limit, a wrong key) costs the guard and the refusal only, not the layers it never needed. Live (a flood
    of 200 requests/s refused with 429, fake engine), the server's loop spent 0.72-0.80 ms of CPU per refused request
    with the guard inside the stack, 0.69-0.71 ms in front of it, and 0.39 ms with a bare ASGI app answering 429
    (uvicorn and the socket alone; docs/benchmarks.md, 2026-11-26 afternoon). Every other request goes on through
    the stack unchanged."""

    guard: GuardMiddleware | None = None  # set by create_app

    async def __call__(self, scope, receive, send) -> None:
        if self.guard is not None and scope["type"] == "http":
            await self.guard(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def behind_guard(self, scope, receive, send) -> None:
        """The rest of the app, once the guard let the request through."""
        await super().__call__(scope, receive, send)


def create_app(
    engine: Engine, settings: ServerSettings, *, model_name: str, keys: KeyStore | KeyRing | None = None
) -> FastAPI:
    """The app; ``keys`` defaults to ``key_store(settings)`` (a bare KeyRing is never reloaded). The caller must
    ``app.state.sessions.close()`` when done (it writes what is pending). Its lifespan reloads the keys on SIGHUP and
    when the keys file changes.

    Raises:
        KeysError: a keys source is unreadable or malformed.
        SessionDbError: ``sessions_db`` cannot be opened, written or migrated.
    """
    keys = keys if keys is not None else key_store(settings)
    keys = keys if isinstance(keys, KeyStore) else KeyStore(keys)
    app = GuardedApp(
        title="turncache",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        lifespan=lambda _app: watch_keys(keys, settings.keys_poll_s),
    )
    app.state.engine = engine
    app.state.keys = keys
    app.state.settings = settings
    gate = TenantGate(lambda tenant: keys.policy(tenant), server_policy(settings))
    app.state.gate = gate
    store = session_store(settings, quota=gate.open_sessions)
    app.state.sessions = store
    response_store = ResponseStore()  # /v1/responses kept for previous_response_id, per tenant
    app.state.responses = response_store
    adapters = AdapterSelector(engine.runtime, model_name)  # `model` -> a LoRA adapter (or the base)
    app.state.adapters = adapters
    lora_api.install_routes(app, adapters)

    if settings.media_url_hosts:  # inside the guard (added first): only requests with a valid key fetch anything
        app.add_middleware(
            MediaURLMiddleware,
            policy=media_url_policy(settings),
            max_body=settings.max_body_mib * MiB,
            refuse=refusal,
        )

    def admit_early(tenant: Tenant) -> RateLimitedError | None:
        """Refuse a tenant over a limit before its request's body is read (a request holds at least one turn: the
        route's own admission, which knows how many, would refuse it too)."""
        refusal = gate.check(tenant.id)
        return RateLimitedError(refusal) if refusal is not None else None

    app.guard = GuardMiddleware(  # outermost, in front of FastAPI's own stack (the media URL fetcher runs only
        # behind a valid key, within limits)
        app.behind_guard,
        authenticate=keys.authenticate,
        max_body=settings.max_body_mib * MiB,
        refuse=refusal,
        admit_early=admit_early,
        refusal_hold_s=settings.refusal_hold_s,
    )

    def stream_response(events) -> TimedStreamingResponse:
        return TimedStreamingResponse(events, media_type="text/event-stream", send_timeout_s=settings.send_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())), routed_path(request.scope))

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc, routed_path(request.scope))

    @app.exception_handler(EngineError)
    @app.exception_handler(GrammarError)
    @app.exception_handler(RateLimitedError)
    @app.exception_handler(SamplingFieldError)
    async def engine_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, routed_path(request.scope))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, routed_path(request.scope))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "active_turns": engine.active_turns()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> str:
        """An admin key (``--auth-token``'s, one flagged in the keys file, anyone on an open server): the server's
        metrics and every tenant's figures; any other key: its own tenant's figures only."""
        tenant: Tenant = request.state.tenant
        if not tenant.admin:
            own = {tenant.id: gate.figures_of(tenant.id)}
            return render_tenant_metrics(own, {tenant.id: gate.active(tenant.id)})
        text = render_metrics(engine.metrics, engine.cache_stats())
        if isinstance(store, SqliteSessionStore):
            text += render_session_metrics(store.writer.stats, store.writer.pending)
        tenants = set(gate.figures) | set(keys.ring.tenants())
        figures = {t: gate.figures_of(t) for t in tenants}
        return text + render_tenant_metrics(figures, {t: gate.active(t) for t in tenants})

    @app.get("/v1/models")
    async def models() -> dict:
        listed = {"id": model_name, "object": "model", "created": 0, "owned_by": "local"}
        # extension: whether the model has a chat template (false: a base model, completions only)
        chat = chats(engine.runtime)
        return {"object": "list", "data": [{**listed, "chat": chat}, *({**a, "chat": chat} for a in adapters.cards())]}

    admission = Admission(engine, gate, adapters)
    app.state.admission = admission
    check_model = admission.check_model  # the model or one of its adapters (the adapter, or None), else model_not_found
    max_pending = settings.stream_buffer_events

    @app.post("/v1/chat/completions")
    async def chat_completions(body: openai_api.ChatCompletionRequest, request: Request):
        adapter = check_model(body.model)
        require_chat(engine.runtime)
        body.check(settings.max_n)
        tenant: Tenant = request.state.tenant
        prepared = openai_api.prepare(body, tenant.salt, engine.runtime, reply_cap=settings.max_reply_tokens)
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        args = (tenant_engine, prepared.turns, model_name, prepared.plan, prepared.markers)
        if body.stream:
            return stream_response(await openai_api.stream(*args, max_pending=max_pending))
        return await openai_api.complete(*args)

    @app.post("/v1/completions")
    async def completions(body: completions_api.CompletionRequest, request: Request):
        adapter = check_model(body.model)
        body.check(settings.max_n)
        tenant: Tenant = request.state.tenant
        prepared = completions_api.prepare(body, tenant.salt, engine.runtime, reply_cap=settings.max_reply_tokens)
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        if body.stream:
            events = await completions_api.stream(
                tenant_engine, body, prepared.turns, model_name, max_pending=max_pending
            )
            return stream_response(events)
        return await completions_api.complete(tenant_engine, body, prepared.turns, model_name)

    @app.post("/v1/responses")
    async def responses(body: responses_api.ResponsesRequest, request: Request):
        adapter = check_model(body.model)
        require_chat(engine.runtime)
        body.check()
        tenant: Tenant = request.state.tenant
        history: tuple = ()
        if body.previous_response_id is not None:
            prior = response_store.get(body.previous_response_id, tenant.id)
            if prior is None:
                message = f"previous_response_id: no response {body.previous_response_id!r}"
                raise RequestError(ErrorCode.NOT_FOUND, message, param="previous_response_id")
            history = prior.messages
        prepared, conversation = responses_api.prepare(
            body, history, tenant.salt, engine.runtime, reply_cap=settings.max_reply_tokens, max_n=settings.max_n
        )
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        (turn,) = prepared.turns
        args = (tenant_engine, turn, body, model_name, prepared.plan, prepared.markers, response_store, tenant.id)
        if body.stream:
            return stream_response(await responses_api.stream(*args, conversation, max_pending=max_pending))
        return await responses_api.complete(*args, conversation)

    @app.post("/v1/messages")
    async def messages(body: anthropic_types.MessagesRequest, request: Request):
        """Anthropic's Messages API (``?beta=true`` accepted: the query is not read)."""
        adapter = check_model(body.model)
        require_chat(engine.runtime)
        anthropic_convert.check(body)
        tenant: Tenant = request.state.tenant
        runtime = engine.runtime
        converted = anthropic_convert.to_chat(body, runtime)
        prepared = anthropic_convert.prepare(converted, tenant.salt, runtime)
        breakpoints = await asyncio.to_thread(
            anthropic_convert.breakpoint_tokens, converted, prepared.turns[0], tenant.salt, runtime
        )
        prepared = replace(prepared, turns=anthropic_convert.with_breakpoints(prepared.turns, breakpoints))
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        reply = anthropic_api.Reply(body.model, converted, breakpoints, runtime, tuple(body.stop_sequences or ()))
        if body.stream:
            return stream_response(await anthropic_api.stream(tenant_engine, prepared, reply, max_pending=max_pending))
        return await anthropic_api.complete(tenant_engine, prepared, reply)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: anthropic_types.CountTokensRequest, request: Request) -> dict:
        check_model(body.model)
        require_chat(engine.runtime)
        anthropic_convert.check(body)
        tenant: Tenant = request.state.tenant
        return await asyncio.to_thread(anthropic_convert.count_tokens, body, tenant.salt, engine.runtime)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict:
        found = response_store.get(response_id, request.state.tenant.id)
        if found is None:
            raise RequestError(ErrorCode.NOT_FOUND, f"no response {response_id!r}", param="response_id")
        return found.body

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> dict:
        if not response_store.delete(response_id, request.state.tenant.id):
            raise RequestError(ErrorCode.NOT_FOUND, f"no response {response_id!r}", param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/tokenize")
    async def tokenize(body: tokenize_api.TokenizeRequest) -> dict:
        check_model(body.model)
        return tokenize_api.tokenize(body, engine.runtime)

    @app.post("/detokenize")
    async def detokenize(body: tokenize_api.DetokenizeRequest) -> dict:
        check_model(body.model)
        return tokenize_api.detokenize(body, engine.runtime)

    @app.websocket("/v1/ws")
    async def chat_socket(ws: WebSocket) -> None:
        await serve_socket(
            ws,
            engine,
            store,
            model_name,
            keys=keys,
            gate=gate,
            allowed_origins=settings.allowed_origins,
            reply_cap=settings.max_reply_tokens,
            max_pending=settings.stream_buffer_events,
            send_timeout_s=settings.send_timeout_s,
            adapters=adapters,
        )

    if (WEB_DIR / "index.html").is_file():
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app
