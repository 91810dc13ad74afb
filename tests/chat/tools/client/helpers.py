"""Servers for client and eval tests: the real app on a fake engine, and a scripted stand-in that records frames."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from websockets.sync.server import ServerConnection, serve

from tests.chat.server.conftest import make_server

Respond = Callable[[dict[str, Any]], list[dict[str, Any]] | None]  # None: close the connection instead


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/ws"


@contextmanager
def fake_server(**settings: Any) -> Iterator[tuple[Any, str]]:
    """The real app on the fake engine (text only); yields (engine, ws url)."""
    engine, srv = make_server(**settings)
    with srv:
        yield engine, ws_url(srv)
    engine.close()


SESSION = {
    "id": "sess_000000000000000000000001",
    "model": "fake",
    "messages": 0,
    "state": "idle",
    "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 256, "stop": []},
}


def session_created(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "session.created", "reply_to": event.get("event_id"), "session": SESSION}]


@contextmanager
def scripted_server(respond: Respond) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A WebSocket server that records every frame it receives and answers with ``respond(event)``; yields
    (ws url, the recorded events)."""
    frames: list[dict[str, Any]] = []

    def handler(ws: ServerConnection) -> None:
        for raw in ws:
            event = json.loads(raw)
            frames.append(event)
            out = respond(event)
            if out is None:
                ws.close(1011, "scripted drop")
                return
            for reply in out:
                ws.send(json.dumps(reply))

    with serve(handler, "127.0.0.1", 0, max_size=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/v1/ws", frames
        server.shutdown()
        thread.join(5)


def drop_on_turn(event: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Answers session.create; drops the connection when a turn arrives."""
    if event["type"] == "session.create":
        return session_created(event)
    if event["type"] in ("turn.create", "completion.create"):
        return None
    return []


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
