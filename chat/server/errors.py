"""How every error a client can meet is reported, on both transports, in one place: exception -> wire code
(:func:`code_of`), wire code -> HTTP status, OpenAI error type and WebSocket close code (:data:`TRANSPORT`).
Validation code never raises web-framework exceptions; ``app.py``, ``openai_api.py`` and ``ws.py`` look errors up
here and nowhere else.

Exceptions and their wire code::

    ProtocolError (chat.protocol)          its .code: the WebSocket protocol's refusals (docs/protocol.md)
    RequestError (below)                   its .code: what the HTTP transport refuses (body, key, envelope, model;
                                            a body that does not validate: validation_error)
    ContextOverflowError                   context_overflow
    GrammarError                           invalid_grammar (response_format / structured_outputs)
    NoChatTemplateError                    no_chat_template (a chat route, /v1/responses or a WebSocket turn for a
                                                             base model; the message names --chat-template)
    ChatTemplateError                      template_error  (the chat template raised rendering the messages)
    SamplingFieldError                     invalid_sampling (.field names it)
    UnsupportedMediaError                  invalid_media   (.item names the part)
    InvalidMediaError, MediaError          invalid_media   (.item)
    EngineClosedError                      unavailable
    AdapterFileError, AdapterMismatchError invalid_request (a LoRA adapter that cannot be loaded: the message names
                                            the file or the module that does not fit)
    UnknownAdapterError                    model_not_found (no LoRA adapter of that name)
    RateLimitedError                       rate_limited    (HTTP 429 with Retry-After; on the WebSocket an
                                                            `error` event, the connection stays usable)
    SlowClientError (below)                slow_client     (a stream's client read too slowly: more than
                                                            --stream-buffer-events unread, or a write stalled for
                                                            --send-timeout-s; its turns are cancelled, the
                                                            connection closed: WebSocket close code 1013)
    anything else                          internal        (CacheError, ModelError such as RunStateError, bugs:
                                                            logged by the transport, never described to the client)

Wire codes and what each transport does with them (:data:`TRANSPORT`): an HTTP status and OpenAI ``type`` for
``{"error": {...}}`` bodies; on the WebSocket, ``None`` means an ``error`` event on an open connection, a number
means the socket is closed with that code instead (only refusals before or outside the protocol: a bad key or
origin, a frame over the server's size limit, which uvicorn closes with 1009 itself; a key removed from the keys
file while its socket is open: ``key_revoked``).
"""

from __future__ import annotations

from dataclasses import dataclass

from chat.engine.constraints import GrammarError
from chat.engine.errors import (
    ChatTemplateError,
    ContextOverflowError,
    EngineClosedError,
    InvalidMediaError,
    NoChatTemplateError,
    UnsupportedMediaError,
)
from chat.models.errors import AdapterFileError, AdapterMismatchError, UnknownAdapterError
from chat.protocol.content import INVALID_MEDIA
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.server.reply.turns import SamplingFieldError
from chat.server.tenancy.ratelimit import RateLimitedError
from modalities.errors import MediaError

POLICY_VIOLATION = 1008  # WebSocket close code: refused credentials or origin
MESSAGE_TOO_BIG = 1009  # WebSocket close code: a frame over the server's limit (sent by the WebSocket library)
TRY_AGAIN_LATER = 1013  # WebSocket close code: the client read too slowly (slow_client)
INTERNAL_MESSAGE = "internal error; the server logged the details"  # all a client learns of an internal error


@dataclass(frozen=True, slots=True)
class Transport:
    """How one wire code travels."""

    status: int  # HTTP status
    kind: str  # OpenAI-style error "type"
    ws_close: int | None = None  # WebSocket: None = an `error` event, the connection stays open; else a close code


_BAD = Transport(400, "invalid_request_error")
TRANSPORT: dict[ErrorCode, Transport] = {
    ErrorCode.INVALID_JSON: _BAD,
    ErrorCode.FRAME_TOO_LARGE: Transport(413, "invalid_request_error"),
    ErrorCode.TOO_LARGE: Transport(413, "invalid_request_error", ws_close=MESSAGE_TOO_BIG),
    ErrorCode.UNKNOWN_EVENT: _BAD,
    ErrorCode.INVALID_EVENT: _BAD,
    ErrorCode.INVALID_REQUEST: _BAD,
    ErrorCode.INVALID_SAMPLING: _BAD,
    ErrorCode.INVALID_GRAMMAR: _BAD,
    ErrorCode.UNKNOWN_PARAMETER: _BAD,
    ErrorCode.UNSUPPORTED_PARAMETER: _BAD,
    ErrorCode.INVALID_MEDIA: _BAD,
    ErrorCode.NO_SESSION: _BAD,
    ErrorCode.UNKNOWN_SESSION: Transport(404, "invalid_request_error"),
    ErrorCode.UNKNOWN_MODEL: Transport(404, "invalid_request_error"),
    ErrorCode.MODEL_NOT_FOUND: Transport(404, "invalid_request_error"),
    ErrorCode.NOT_FOUND: Transport(404, "invalid_request_error"),
    ErrorCode.BUSY: Transport(409, "invalid_request_error"),
    ErrorCode.NOT_GENERATING: Transport(409, "invalid_request_error"),
    ErrorCode.CONFLICT: Transport(409, "invalid_request_error"),
    ErrorCode.CONTEXT_OVERFLOW: _BAD,
    ErrorCode.NO_CHAT_TEMPLATE: _BAD,
    ErrorCode.TEMPLATE_ERROR: _BAD,
    ErrorCode.UNAUTHORIZED: Transport(401, "invalid_request_error", ws_close=POLICY_VIOLATION),
    ErrorCode.ORIGIN_NOT_ALLOWED: Transport(403, "invalid_request_error", ws_close=POLICY_VIOLATION),
    ErrorCode.RATE_LIMITED: Transport(429, "rate_limit_error"),
    ErrorCode.KEY_REVOKED: Transport(401, "invalid_request_error", ws_close=POLICY_VIOLATION),
    ErrorCode.SLOW_CLIENT: Transport(408, "invalid_request_error", ws_close=TRY_AGAIN_LATER),
    ErrorCode.UNAVAILABLE: Transport(503, "server_error"),
    ErrorCode.INTERNAL: Transport(500, "server_error"),
}

_BY_EXCEPTION: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (ContextOverflowError, ErrorCode.CONTEXT_OVERFLOW),
    (GrammarError, ErrorCode.INVALID_GRAMMAR),
    (NoChatTemplateError, ErrorCode.NO_CHAT_TEMPLATE),
    (ChatTemplateError, ErrorCode.TEMPLATE_ERROR),
    (SamplingFieldError, ErrorCode.INVALID_SAMPLING),
    (UnsupportedMediaError, ErrorCode.INVALID_MEDIA),
    (InvalidMediaError, ErrorCode.INVALID_MEDIA),
    (MediaError, ErrorCode.INVALID_MEDIA),
    (EngineClosedError, ErrorCode.UNAVAILABLE),
    (RateLimitedError, ErrorCode.RATE_LIMITED),
    (AdapterFileError, ErrorCode.INVALID_REQUEST),
    (AdapterMismatchError, ErrorCode.INVALID_REQUEST),
    (UnknownAdapterError, ErrorCode.MODEL_NOT_FOUND),
)


class SlowClientError(Exception):
    """A client did not read its stream fast enough (``slow_client``): the events it left unread passed the
    per-connection bound, or one write waited longer than the send timeout."""

    code = ErrorCode.SLOW_CLIENT

    def body(self) -> dict:
        """OpenAI's error object for it, as the last chunk of a stream carries it."""
        return {"message": str(self), "type": TRANSPORT[self.code].kind, "code": self.code.value}


class RequestError(Exception):
    """Bad request content found by the HTTP transport itself (not by the protocol types or the engine)."""

    def __init__(self, code: ErrorCode, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code  # the wire code; its status comes from TRANSPORT
        self.param = param  # the offending request field, OpenAI's `param`


@dataclass(frozen=True, slots=True)
class Reported:
    """What a client is told about one exception."""

    code: ErrorCode  # the wire code
    message: str  # safe to show: our own errors' messages, a fixed text for internal ones
    param: str | None  # the field or media item concerned, when known
    transport: Transport  # HTTP status / type, WebSocket close code


def validation_error(errors: list[dict]) -> RequestError:
    """The refusal of a request body that does not validate: ``invalid_media`` naming the part
    (``messages[i].content[j]``) when a media part is at fault, else ``invalid_request`` naming the field."""
    unknown = [e for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:  # OpenAI's words for a field it does not know
        name = ".".join(str(p) for p in unknown[0].get("loc", ()) if p != "body")
        return RequestError(ErrorCode.UNKNOWN_PARAMETER, f"Unrecognized request argument supplied: {name}", param=name)
    media = [e for e in errors if e.get("type") == INVALID_MEDIA]
    first = media[0] if media else errors[0] if errors else {}
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if media:
        at = [p for p in loc if isinstance(p, int)][:2]
        item = f"messages[{at[0]}].content[{at[1]}]" if len(at) == 2 else f"messages[{at[0]}]" if at else None
        return RequestError(ErrorCode.INVALID_MEDIA, f"{item or 'messages'}: {first.get('msg')}", param=item)
    where = ".".join(str(p) for p in loc)
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else "invalid request"
    return RequestError(ErrorCode.INVALID_REQUEST, message, param=where or None)


def code_of(exc: BaseException) -> ErrorCode:
    """The wire code of any exception (``internal`` for everything this table does not name)."""
    if isinstance(exc, ProtocolError | RequestError | SlowClientError):
        return exc.code
    for cls, code in _BY_EXCEPTION:
        if isinstance(exc, cls):
            return code
    return ErrorCode.INTERNAL


def describe(exc: BaseException) -> Reported:
    """How ``exc`` is reported on either transport."""
    code = code_of(exc)
    if code is ErrorCode.INTERNAL:
        return Reported(code, INTERNAL_MESSAGE, None, TRANSPORT[code])
    message = exc.message if isinstance(exc, ProtocolError) else str(exc)
    param = exc.param if isinstance(exc, RequestError) else getattr(exc, "item", getattr(exc, "field", None))
    return Reported(code, message, None if param is None else str(param), TRANSPORT[code])
