"""chat/tools/client/errors.py: the client's one error tree; every wire code to its family, unknown codes to
ServerError, and what each error carries."""

from __future__ import annotations

import chat.tools.client
from chat.tools.client import errors


def test_every_error_code_maps_to_its_family_and_the_tree_is_drawn():
    from chat.protocol import ErrorCode

    for code in ErrorCode:
        error = errors.error_for(code.value, "m")
        assert isinstance(error, errors.ChatError) and error.code == code.value
        assert type(error).__name__ in errors.__doc__, type(error).__name__
    assert type(errors.error_for("something_new", "m")) is errors.ServerError
    for name in chat.tools.client.__all__:
        value = getattr(chat.tools.client, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, errors.ClientError) and name in errors.__doc__, name


def test_a_chat_error_says_its_code_and_keeps_the_failed_turn():
    reply = object()
    error = errors.error_for("context_overflow", "the prompt has 90 tokens", turn_id="turn_3", reply=reply)
    assert type(error) is errors.ContextOverflowError and str(error) == "context_overflow: the prompt has 90 tokens"
    assert (error.message, error.turn_id, error.reply) == ("the prompt has 90 tokens", "turn_3", reply)
    refused = errors.error_for("busy", "a turn is running")
    assert type(refused) is errors.BusyError and refused.turn_id is None and refused.reply is None


def test_transport_errors_carry_the_handshake_status_or_the_close_code():
    assert errors.ConnectFailed("rejected", status=403).status == 403 and errors.ConnectFailed("refused").status is None
    lost = errors.ConnectionLost("closed", close_code=1009)
    assert lost.close_code == 1009 and isinstance(lost, errors.ChatConnectionError)
    assert isinstance(errors.MediaEncodingError("bad array"), ValueError)  # callers may catch it as a bad value
