"""The chat WebSocket's route (``chat/server/routes/chat_socket.py``), through the app: the server's settings reach
each socket (allowed origins, the reply cap of a turn without ``max_tokens``). (The protocol on the socket:
tests/chat/server/surfaces/test_ws.py.)"""

from __future__ import annotations

import pytest
from starlette.websockets import WebSocketDisconnect

from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.routes.conftest import app_client


@pytest.fixture(scope="module")
def client():
    runtime = FakeRuntime(script=lambda prompt: "word " * 50)
    with app_client(runtime, allowed_origins=["http://good.example"], max_reply_tokens=4) as (_, client):
        yield client


def until(ws, kind: str) -> dict:
    while (event := ws.receive_json())["type"] != kind:
        pass
    return event


def test_a_turn_is_capped_at_the_servers_reply_tokens_from_an_allowed_origin(client):
    with client.websocket_connect("/v1/ws", headers={"origin": "http://good.example"}) as ws:
        ws.send_json({"type": "session.create"})
        until(ws, "session.created")
        ws.send_json({"type": "turn.create", "content": "go"})
        done = until(ws, "reply.done")
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 4


def test_another_origin_is_refused(client):
    with (
        pytest.raises(WebSocketDisconnect) as info,
        client.websocket_connect("/v1/ws", headers={"origin": "http://evil.example"}) as ws,
    ):
        ws.receive_json()
    assert info.value.code == 1008
