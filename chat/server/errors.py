"""How every error the server can meet is reported: one table from error to HTTP status, WebSocket close code
and wire code. Validation code never raises web-framework exceptions; the transports look errors up here."""

from __future__ import annotations

from dataclasses import dataclass

from cache import CacheError
from chat.engine.errors import (
    ContextOverflowError,
    EngineClosedError,
    InvalidMediaError,
    InvalidSamplingError,
    UnsupportedMediaError,
)


@dataclass(frozen=True)
class Mapping:
    status: int  # HTTP status
    code: str  # machine-readable code on the wire
    kind: str  # OpenAI-style error "type"


class RequestError(Exception):
    """Bad request content found by the transport layer (not by the engine)."""

    def __init__(self, code: str, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.param = param


TABLE: list[tuple[type[BaseException], Mapping]] = [
    (ContextOverflowError, Mapping(400, "context_overflow", "invalid_request_error")),
    (InvalidSamplingError, Mapping(400, "invalid_sampling", "invalid_request_error")),
    (UnsupportedMediaError, Mapping(400, "invalid_media", "invalid_request_error")),
    (InvalidMediaError, Mapping(400, "invalid_media", "invalid_request_error")),
    (EngineClosedError, Mapping(503, "unavailable", "server_error")),
    (CacheError, Mapping(500, "internal", "server_error")),
]


def describe(exc: BaseException) -> tuple[int, str, str, str | None]:
    """(status, code, type, param) for an exception."""
    if isinstance(exc, RequestError):
        return exc.status, exc.code, "invalid_request_error", exc.param
    for cls, m in TABLE:
        if isinstance(exc, cls):
            param = getattr(exc, "field", None) or getattr(exc, "item", None)
            return m.status, m.code, m.kind, param
    return 500, "internal", "server_error", None


def public_message(exc: BaseException) -> str:
    """What the client may read: our own errors' messages; never internals of unexpected failures."""
    status, *_ = describe(exc)
    if status >= 500 and not isinstance(exc, EngineClosedError):
        return "internal error; the server logged the details"
    return str(exc)
