"""The one error table (chat/server/errors.py): every wire code has its HTTP status and WebSocket behaviour, every
error the engine, the models and the media layer raise has its code, and internal details never reach a client."""

from __future__ import annotations

import pytest

from cache import CacheError
from chat.engine.errors import ContextOverflowError, EngineClosedError, InvalidMediaError, UnsupportedMediaError
from chat.models.errors import RunStateError
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.server.errors import INTERNAL_MESSAGE, TRANSPORT, RequestError, code_of, describe
from modalities.errors import CorruptMediaError


def test_every_code_has_a_transport_and_only_refusals_outside_the_protocol_close_the_socket():
    assert set(TRANSPORT) == set(ErrorCode)
    closing = {code for code, t in TRANSPORT.items() if t.ws_close is not None}
    assert closing == {
        ErrorCode.UNAUTHORIZED,
        ErrorCode.ORIGIN_NOT_ALLOWED,
        ErrorCode.TOO_LARGE,
        ErrorCode.KEY_REVOKED,
        ErrorCode.SLOW_CLIENT,
    }
    assert {t.ws_close for t in TRANSPORT.values()} == {None, 1008, 1009, 1013}
    assert all((t.status >= 500) == (t.kind == "server_error") for t in TRANSPORT.values())


@pytest.mark.parametrize(
    ("exc", "code", "param"),
    [
        (ContextOverflowError(10, 8), ErrorCode.CONTEXT_OVERFLOW, None),
        (
            UnsupportedMediaError("messages[0].content[1]", "image", "m"),
            ErrorCode.INVALID_MEDIA,
            "messages[0].content[1]",
        ),
        (InvalidMediaError("messages[2].content[0]", "bad"), ErrorCode.INVALID_MEDIA, "messages[2].content[0]"),
        (CorruptMediaError("truncated", item=3), ErrorCode.INVALID_MEDIA, "3"),
        (EngineClosedError("the engine is shut down"), ErrorCode.UNAVAILABLE, None),
        (ProtocolError(ErrorCode.BUSY, "generating"), ErrorCode.BUSY, None),
        (RequestError(ErrorCode.INVALID_SAMPLING, "top_p: no", param="top_p"), ErrorCode.INVALID_SAMPLING, "top_p"),
    ],
)
def test_engine_model_and_media_errors_have_their_code(exc, code, param):
    reported = describe(exc)
    assert code_of(exc) is code and reported.code is code and reported.param == param
    assert reported.transport is TRANSPORT[code] and reported.message != INTERNAL_MESSAGE


@pytest.mark.parametrize("exc", [CacheError("index broken"), RunStateError("no plan"), KeyError("secret path")])
def test_anything_else_is_internal_and_says_nothing_about_itself(exc):
    reported = describe(exc)
    assert reported.code is ErrorCode.INTERNAL and reported.transport.status == 500
    assert reported.message == INTERNAL_MESSAGE and reported.param is None
