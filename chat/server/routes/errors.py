"""Errors as responses: OpenAI's error body with the status of its code (``chat/server/errors.py``'s one table), or
Anthropic's on its routes; the exception handlers that answer with them."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from chat.engine.constraints import GrammarError
from chat.engine.errors import EngineError
from chat.server.errors import RequestError, describe, validation_error
from chat.server.reply.turns import SamplingFieldError
from chat.server.surfaces import anthropic_api
from chat.server.tenancy.ratelimit import RateLimitedError

log = logging.getLogger("turncache.server")


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


def register(app: FastAPI, parts=None) -> None:
    """Every error a route raises answered in its surface's shape."""

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
