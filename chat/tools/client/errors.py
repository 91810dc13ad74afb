"""The client's one error hierarchy. Everything the client raises on purpose is a :class:`ClientError`::

    ClientError
    ├── ChatError(code, message, turn_id)       the server sent an ``error`` event; ``code`` is the wire code
    │   ├── InvalidRequestError                   invalid_json, frame_too_large, unknown_event, invalid_event,
    │   │                                         no_chat_template, template_error
    │   ├── InvalidMediaError                     invalid_media
    │   ├── SessionError                          no_session, unknown_session, unknown_model
    │   ├── BusyError                             busy, not_generating
    │   ├── ContextOverflowError                  context_overflow
    │   ├── UnauthorizedError                     unauthorized
    │   └── ServerError                           internal, unavailable, and any code this client does not know
    ├── ChatConnectionError                     the transport failed
    │   ├── ConnectFailed                         could not open the WebSocket (refused, handshake rejected, bad URL)
    │   ├── ConnectionLost                        the connection closed while the client was using it
    │   └── ChatTimeout                           no answer from the server within the client's ``timeout``
    ├── MediaEncodingError (also ValueError)    a media input could not be turned into a content part (client side)
    └── UnexpectedServerEvent                   the server sent a frame that is not a server event

:func:`error_for` picks the :class:`ChatError` subclass for a wire code. A failed turn raises its ``ChatError`` with
``reply`` set to the turn's ``reply.done`` (usage and timings up to the failure); a refused event has ``reply=None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chat.tools.client.reply import Reply


class ClientError(Exception):
    """Base of every error the chat client raises on purpose."""


class ChatError(ClientError):
    """The server answered with an ``error`` event. Nothing changed on the server (see docs/protocol.md)."""

    def __init__(self, code: str, message: str, turn_id: str | None = None, reply: Reply | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code  # the wire code, e.g. "invalid_media"
        self.message = message  # the server's detail (field paths for invalid_event / invalid_media)
        self.turn_id = turn_id  # set when a started turn failed; None when the event was refused outright
        self.reply = reply  # the failed turn's reply.done (finish_reason "error"), when there was one


class InvalidRequestError(ChatError):
    """The event was malformed: ``invalid_json``, ``frame_too_large``, ``unknown_event``, ``invalid_event``; or it
    cannot be rendered for this model: ``no_chat_template`` (a base model), ``template_error`` (its template raised)."""


class InvalidMediaError(ChatError):
    """A media part was refused or did not decode (``invalid_media``); also a text-only model given media."""


class SessionError(ChatError):
    """No usable session or model: ``no_session``, ``unknown_session``, ``unknown_model``."""


class BusyError(ChatError):
    """A turn is already running (``busy``), or there was none to cancel (``not_generating``)."""


class ContextOverflowError(ChatError):
    """The prompt does not fit the model's context window, or the conversation hit a limit."""


class UnauthorizedError(ChatError):
    """The server refused the credentials."""


class ServerError(ChatError):
    """``internal``: a bug or a model failure on the server; ``unavailable``: it is shutting down (also used for codes
    this client does not know)."""


_BY_CODE: dict[str, type[ChatError]] = {
    "invalid_json": InvalidRequestError,
    "frame_too_large": InvalidRequestError,
    "unknown_event": InvalidRequestError,
    "invalid_event": InvalidRequestError,
    "no_chat_template": InvalidRequestError,
    "template_error": InvalidRequestError,
    "invalid_media": InvalidMediaError,
    "no_session": SessionError,
    "unknown_session": SessionError,
    "unknown_model": SessionError,
    "busy": BusyError,
    "not_generating": BusyError,
    "context_overflow": ContextOverflowError,
    "unauthorized": UnauthorizedError,
    "unavailable": ServerError,
    "internal": ServerError,
}


def error_for(code: str, message: str, turn_id: str | None = None, reply: Reply | None = None) -> ChatError:
    """The :class:`ChatError` subclass instance for a wire ``code`` (unknown codes give :class:`ServerError`)."""
    return _BY_CODE.get(code, ServerError)(code, message, turn_id, reply)


class ChatConnectionError(ClientError):
    """The WebSocket could not be opened or was lost. The client is unusable afterwards: open a new one."""


class ConnectFailed(ChatConnectionError):
    """Opening the WebSocket failed: connection refused, DNS, TLS, or the server rejected the handshake."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status of a rejected handshake (403: wrong or missing token), else None


class ConnectionLost(ChatConnectionError):
    """The connection closed while the client was using it (server gone, network, or a close by the server)."""

    def __init__(self, message: str, close_code: int | None = None) -> None:
        super().__init__(message)
        self.close_code = close_code  # the WebSocket close code when one was received (1008: policy, 1009: too big)


class ChatTimeout(ChatConnectionError):
    """The server did not answer within the client's ``timeout``. The connection is closed."""


class MediaEncodingError(ClientError, ValueError):
    """A media input could not be encoded as a content part (unknown type, unreadable file, bad array)."""


class UnexpectedServerEvent(ClientError):
    """The server sent a frame that is not a valid server event (a server or version mismatch)."""
