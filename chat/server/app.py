"""The FastAPI application: transport only. It turns HTTP (and WebSocket) traffic into engine calls and engine
results and errors back into wire responses; every decision about content lives in the engine and the protocol.

Routes: ``/`` (the web UI), ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``, Anthropic's ``POST /v1/messages`` and
``/v1/messages/count_tokens``, ``POST /tokenize`` and ``/detokenize`` (as vLLM's), ``POST /v1/load_lora_adapter``
and ``/v1/unload_lora_adapter`` (as vLLM's; ``surfaces/lora_api.py``), and the chat WebSocket ``/v1/ws`` (see
docs/protocol.md, docs/openai.md, docs/anthropic.md), each registered by its module of ``chat.server.routes``.
Every route that generates goes through the one reply pipeline (``chat.server.reply``); a request's ``model`` may
name a loaded LoRA adapter (``reply/adapters.py``). Here: the app's state (keys, tenants, stores, adapters), the
guard in front of it, and the list of route modules. A base model (no chat template) serves completions,
``/tokenize`` of a prompt and ``/detokenize``; its chat routes, ``/v1/responses``, ``/v1/messages``, ``/tokenize``
of messages and WebSocket turns answer ``no_chat_template`` (``/v1/models`` lists it with ``"chat": false``).
"""

from __future__ import annotations

from fastapi import FastAPI

from chat.engine.engine import Engine
from chat.protocol.store import InMemorySessionStore
from chat.server.persistence.session_backends import open_session_store, response_store_for
from chat.server.reply.adapters import AdapterSelector
from chat.server.reply.admission import Admission
from chat.server.routes import anthropic, chat_socket, errors, openai, ops, tokens, web
from chat.server.routes.errors import refusal
from chat.server.routes.parts import ServerParts
from chat.server.settings import MiB, ServerSettings
from chat.server.surfaces import lora_api
from chat.server.tenancy.auth import KeyRing, Tenant
from chat.server.tenancy.key_store import KeyStore, watch_keys
from chat.server.tenancy.policy import TenantPolicy
from chat.server.tenancy.ratelimit import Limits, RateLimitedError
from chat.server.tenancy.tenant_gate import TenantGate
from chat.server.transport.guard import GuardMiddleware
from chat.server.transport.media_urls import MediaURLMiddleware
from chat.server.transport.url_fetch import MediaURLPolicy


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
    """In memory, or kept in ``sessions_db`` (an SQLite file, or a PostgreSQL URL:
    ``chat/server/persistence/session_backends.py``); ``quota(owner)``: its open sessions."""
    return open_session_store(settings.sessions_db, settings.max_sessions, quota=quota)


def media_url_policy(settings: ServerSettings) -> MediaURLPolicy:
    return MediaURLPolicy(
        hosts=tuple(settings.media_url_hosts),
        max_bytes=settings.media_url_max_bytes,
        timeout_s=settings.media_url_timeout_s,
        allow_private=settings.media_url_allow_private,
        ca_file=settings.media_url_ca_file,
    )


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
    response_store = response_store_for(store)  # /v1/responses kept for previous_response_id, per tenant
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
        refused = gate.check(tenant.id)
        return RateLimitedError(refused) if refused is not None else None

    app.guard = GuardMiddleware(  # outermost, in front of FastAPI's own stack (the media URL fetcher runs only
        # behind a valid key, within limits)
        app.behind_guard,
        authenticate=keys.authenticate,
        max_body=settings.max_body_mib * MiB,
        refuse=refusal,
        admit_early=admit_early,
        refusal_hold_s=settings.refusal_hold_s,
    )

    admission = Admission(engine, gate, adapters, settings.served_model_aliases)
    app.state.admission = admission
    parts = ServerParts(engine, settings, model_name, keys, gate, store, response_store, admission, adapters)
    for routes in (errors, ops, openai, anthropic, tokens, chat_socket, web):  # in this order (web: mounted last)
        routes.register(app, parts)
    return app
