"""The protocol's one error type, and the wire codes of both transports.

Everything the protocol layer refuses is a :class:`ProtocolError` carrying an :class:`ErrorCode`; a server sends it
to the client as an ``error`` event (``ErrorEvent.of(exc)``) and keeps the connection open::

    ProtocolError(code, message, event_id)
      parser ........ invalid_json, frame_too_large, unknown_event, invalid_event, invalid_media
      session ....... busy, not_generating, invalid_event (edit / regenerate that does not fit), context_overflow,
                      unknown_session (closed)
      connection .... no_session, unknown_session, unknown_model; store: unknown_session, busy (full),
                      conflict (a shared store: the session changed elsewhere)
      engine/server . context_overflow, invalid_media, unavailable, internal, unauthorized, rate_limited
                      (never raised here), key_revoked (the server closes the socket), no_chat_template (a base
                      model), template_error (the chat template raised)

Only the transport raises ``unauthorized``; the engine reports ``context_overflow``, ``invalid_media``,
``unavailable`` and ``internal`` through ``Session.on_error``; a turn whose grammar or sampling fields do not fit
the model fails with ``invalid_grammar`` / ``invalid_sampling`` before anything is computed. Some codes belong to
the HTTP API only (it has no events): ``invalid_request``, ``unknown_parameter``, ``unsupported_parameter``,
``model_not_found``, ``too_large``. What each code becomes on
each transport (HTTP status, WebSocket close code) is the table in ``chat/server/errors.py``.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """The ``code`` of an ``error`` event. The value is what goes on the wire."""

    INVALID_JSON = "invalid_json"  # the frame is not JSON (or not UTF-8, or nested deeper than MAX_JSON_DEPTH)
    FRAME_TOO_LARGE = "frame_too_large"  # the frame exceeds MAX_FRAME_BYTES
    UNKNOWN_EVENT = "unknown_event"  # `type` names no client event
    INVALID_EVENT = "invalid_event"  # missing / wrong / extra fields (the message names the path), or an event
    # that does not fit the conversation (edit index out of range, nothing to regenerate)
    INVALID_MEDIA = "invalid_media"  # a media part is not a base64 data URL of its kind, or fails to decode
    NO_SESSION = "no_session"  # a session event arrived before session.create / session.resume
    UNKNOWN_SESSION = "unknown_session"  # session.resume names no live session
    UNKNOWN_MODEL = "unknown_model"  # the model is not served here
    BUSY = "busy"  # a turn was asked for while the same session (or stateless slot) is generating
    NOT_GENERATING = "not_generating"  # turn.cancel with nothing to cancel
    CONTEXT_OVERFLOW = "context_overflow"  # the prompt does not fit the model, or the conversation hit a limit
    UNAUTHORIZED = "unauthorized"  # the transport refused the credentials
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"  # a browser page of another origin (the WebSocket closes with 1008)
    UNAVAILABLE = "unavailable"  # the server is shutting down: the engine takes no more turns
    INTERNAL = "internal"  # a bug or a model failure; the session is left as it was before the turn
    INVALID_GRAMMAR = "invalid_grammar"  # response_format / structured_outputs: a schema that is not JSON Schema, a
    # regex or grammar that does not compile, or one over a limit
    INVALID_SAMPLING = "invalid_sampling"  # a sampling field out of range for the model (`param` names it)
    RATE_LIMITED = "rate_limited"  # the tenant is over one of its limits (HTTP 429 + Retry-After); nothing changed
    KEY_REVOKED = "key_revoked"  # the connection's key was removed from the keys file: the WebSocket is closed
    SLOW_CLIENT = "slow_client"  # the client read too slowly: its turns are cancelled, the connection is closed
    CONFLICT = "conflict"  # the session was changed elsewhere (another ingress) since this connection read it: the
    # change was not made, the session is read again (send the event again)
    NO_CHAT_TEMPLATE = "no_chat_template"  # a chat turn for a base model (no chat template; --chat-template gives one)
    TEMPLATE_ERROR = "template_error"  # the chat template raised while rendering the request's messages
    # HTTP only:
    INVALID_REQUEST = "invalid_request"  # the request body is malformed or breaks a limit (`param` names the field)
    UNKNOWN_PARAMETER = "unknown_parameter"  # a request field that no API of ours knows (OpenAI's refusal text)
    UNSUPPORTED_PARAMETER = "unsupported_parameter"  # an OpenAI field this server does not honour (`param` names it)
    NOT_FOUND = "not_found"  # a stored object (a response of /v1/responses) that does not exist for this tenant
    MODEL_NOT_FOUND = "model_not_found"  # `model` is not served here (OpenAI's code for it)
    TOO_LARGE = "too_large"  # the body exceeds --max-body-mib (a WebSocket frame over its limit closes with 1009)


class ProtocolError(Exception):
    """A client event was refused. Nothing was changed by the call that raised it.

    The caller must send ``ErrorEvent.of(exc)`` to the client; the session and connection stay usable.
    """

    def __init__(self, code: ErrorCode, message: str, event_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code  # what went wrong, as a wire code
        self.message = message  # human-readable detail (field paths for invalid_event)
        self.event_id = event_id  # the client event this answers, when known
