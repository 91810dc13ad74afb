"""The chat WebSocket, ``/v1/ws`` (docs/protocol.md)."""

from __future__ import annotations

from fastapi import FastAPI, WebSocket

from chat.server.routes.parts import ServerParts
from chat.server.surfaces.ws import serve_socket


def register(app: FastAPI, parts: ServerParts) -> None:
    settings = parts.settings

    @app.websocket("/v1/ws")
    async def chat_socket(ws: WebSocket) -> None:
        await serve_socket(
            ws,
            parts.engine,
            parts.sessions,
            parts.model_name,
            keys=parts.keys,
            gate=parts.gate,
            allowed_origins=settings.allowed_origins,
            reply_cap=settings.max_reply_tokens,
            max_pending=settings.stream_buffer_events,
            send_timeout_s=settings.send_timeout_s,
            adapters=parts.adapters,
        )
