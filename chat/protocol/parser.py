"""Frames in, events out: ``parse_client_event`` for the server, ``parse_server_event`` for clients.

Both are pure functions of one frame (a WebSocket text or binary message holding one UTF-8 JSON object).
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from chat.protocol.client_events import CLIENT_EVENT_TYPES, ClientEvent
from chat.protocol.content import INVALID_MEDIA
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.limits import MAX_EVENT_ID_CHARS, MAX_FRAME_BYTES
from chat.protocol.server_events import ServerEvent

_CLIENT: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
_SERVER: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)
_CONTENT_TAGS = frozenset({"str", "list"})  # tags of the content union, as pydantic puts them into error paths
_SHOWN_ERRORS = 3  # validation errors quoted in one message


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """Validate one client frame. The caller must dispatch the event (e.g. ``Connection.handle``).

    Raises:
        ProtocolError: ``frame_too_large`` (more than MAX_FRAME_BYTES), ``invalid_json`` (not UTF-8 JSON, or
            nested too deeply), ``unknown_event`` (``type`` names no client event), ``invalid_media`` (a media part
            is not a base64 data URL of its kind), ``invalid_event`` (anything else; the message names the field
            path). ``event_id`` is recovered from the frame whenever it is a valid one.
    """
    data = _frame_bytes(raw)
    try:
        return _CLIENT.validate_json(data, strict=True)
    except ValidationError as exc:
        raise _refusal(exc, data) from None
    except RecursionError:  # pydantic-core parses iteratively with a depth limit; this is a second guard
        raise ProtocolError(ErrorCode.INVALID_JSON, "the frame is nested too deeply") from None


def serialize_server_event(event: ServerEvent) -> str:
    """The JSON text of ``event`` (fields that are None are left out)."""
    return event.model_dump_json(exclude_none=True)


def parse_server_event(raw: str | bytes) -> ServerEvent:
    """Read one server frame (clients and tests).

    Raises:
        pydantic.ValidationError: the frame is not a server event.
    """
    return _SERVER.validate_json(raw)


# ---------------------------------------------------------------- internals


def _frame_bytes(raw: str | bytes) -> bytes:
    if len(raw) > MAX_FRAME_BYTES:  # a str has no more characters than UTF-8 bytes
        raise ProtocolError(ErrorCode.FRAME_TOO_LARGE, f"the frame exceeds {MAX_FRAME_BYTES} bytes")
    if isinstance(raw, str):
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            raise ProtocolError(ErrorCode.INVALID_JSON, "the frame is not valid Unicode") from None
        if len(raw) > MAX_FRAME_BYTES:
            raise ProtocolError(ErrorCode.FRAME_TOO_LARGE, f"the frame exceeds {MAX_FRAME_BYTES} bytes")
    return bytes(raw)


def _refusal(exc: ValidationError, data: bytes) -> ProtocolError:
    errors = exc.errors(include_url=False, include_input=False)
    if any(e["type"] == "json_invalid" for e in errors):
        return ProtocolError(ErrorCode.INVALID_JSON, f"the frame is not JSON: {errors[0]['msg']}")
    obj = _loads(data)  # parses: validate_json accepted the syntax
    event_id = _event_id(obj)
    if not isinstance(obj, dict):
        return ProtocolError(ErrorCode.INVALID_EVENT, "the frame must be a JSON object", event_id)
    if "type" not in obj:
        return ProtocolError(ErrorCode.INVALID_EVENT, "type: Field required", event_id)
    if not isinstance(obj["type"], str):
        return ProtocolError(ErrorCode.INVALID_EVENT, "type: Input should be a valid string", event_id)
    if obj["type"] not in CLIENT_EVENT_TYPES:
        return ProtocolError(ErrorCode.UNKNOWN_EVENT, f"unknown event type {obj['type'][:64]!r}", event_id)
    media = [e for e in errors if e["type"] == INVALID_MEDIA]
    code = ErrorCode.INVALID_MEDIA if media else ErrorCode.INVALID_EVENT
    shown = media or errors
    text = "; ".join(f"{_path(e['loc'])}: {e['msg']}" for e in shown[:_SHOWN_ERRORS])
    if len(shown) > _SHOWN_ERRORS:
        text += f" (and {len(shown) - _SHOWN_ERRORS} more)"
    return ProtocolError(code, text, event_id)


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: ``content.0.text``, not ``turn.create.content.list.0.text.text``."""
    parts: list[str] = []
    for i, item in enumerate(loc[1:], start=1):  # loc[0] is the event's tag
        if item in _CONTENT_TAGS and loc[i - 1] == "content":
            continue  # the str / list tag of a content union
        if item == loc[i - 1]:
            continue  # a content part's tag followed by the field of the same name
        parts.append(str(item))
    return ".".join(parts) or str(loc[0])


def _loads(data: bytes) -> Any:
    try:
        return pydantic_core.from_json(data)
    except (ValueError, RecursionError):
        return None


def _event_id(obj: Any) -> str | None:
    event_id = obj.get("event_id") if isinstance(obj, dict) else None
    if isinstance(event_id, str) and 0 < len(event_id) <= MAX_EVENT_ID_CHARS:
        return event_id
    return None
