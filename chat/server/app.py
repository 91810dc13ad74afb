"""The FastAPI application: transport only. It turns HTTP (and WebSocket) traffic into engine calls and engine
results and errors back into wire responses; every decision about content lives in the engine and the protocol.

Routes: ``/`` (the web UI), ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /v1/models``,
``POST /v1/chat/completions``, and the chat WebSocket ``/v1/ws`` (see docs/protocol.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from chat.engine.engine import Engine
from chat.engine.errors import EngineError
from chat.protocol.store import InMemorySessionStore
from chat.server import openai_api
from chat.server.errors import RequestError, describe, public_message
from chat.server.metrics_text import render_metrics
from chat.server.session_db import SqliteSessionStore
from chat.server.settings import MiB, ServerSettings
from chat.server.ws import serve_socket

log = logging.getLogger("turncache.server")
WEB_DIR = Path(__file__).resolve().parents[2] / "web"


def tenant_salt(token: str | None) -> str:
    """Cache namespace salt of a tenant: derived from its credential, never the credential itself."""
    if not token:
        return ""
    return hashlib.sha256(b"turncache-tenant\0" + token.encode()).hexdigest()[:32]


def error_response(exc: BaseException) -> JSONResponse:
    status, code, kind, param = describe(exc)
    if status >= 500:
        log.error("request failed", exc_info=exc)
    body = {"error": {"message": public_message(exc), "type": kind, "code": code, "param": param}}
    return JSONResponse(body, status_code=status)


def create_app(engine: Engine, settings: ServerSettings, *, model_name: str) -> FastAPI:
    app = FastAPI(title="turncache", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.settings = settings
    token = settings.auth_token.get_secret_value() if settings.auth_token else None

    def bearer(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        return header[7:] if header.lower().startswith("bearer ") else None

    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_mib * MiB):
            return error_response(
                RequestError("too_large", f"request bodies are limited to {settings.max_body_mib} MiB", status=413)
            )
        protected = request.url.path.startswith("/v1/") or request.url.path == "/metrics"
        if token is not None and protected:
            given = bearer(request) or ""
            if not hmac.compare_digest(given.encode(), token.encode()):
                return error_response(RequestError("unauthorized", "missing or wrong bearer token", status=401))
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request"
        return error_response(RequestError("invalid_request", message, param=where or None))

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(EngineError)
    async def engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "active_turns": engine.active_turns()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return render_metrics(engine.metrics, engine.cache_stats())

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "local"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: openai_api.ChatCompletionRequest, request: Request):
        if body.model not in (None, model_name):
            raise RequestError(
                "model_not_found",
                f"unknown model {body.model!r}; this server runs {model_name!r}",
                status=404,
                param="model",
            )
        turn = openai_api.build_turn(body, tenant_salt(bearer(request)), engine.runtime)
        if body.stream:
            return StreamingResponse(openai_api.stream(engine, turn, model_name), media_type="text/event-stream")
        return await openai_api.complete(engine, turn, model_name)

    if settings.sessions_db:
        store: InMemorySessionStore = SqliteSessionStore(settings.sessions_db, max_sessions=settings.max_sessions)
    else:
        store = InMemorySessionStore(max_sessions=settings.max_sessions)
    app.state.sessions = store

    @app.websocket("/v1/ws")
    async def chat_socket(ws: WebSocket) -> None:
        await serve_socket(
            ws, engine, store, model_name, token=token, allowed_origins=settings.allowed_origins, salt_of=tenant_salt
        )

    if (WEB_DIR / "index.html").is_file():
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app
