"""What the route modules share (``chat/server/routes/parts.py``): a stream is a server-sent event response whose
every write is bounded by ``--send-timeout-s``."""

from __future__ import annotations

from chat.server.routes.parts import ServerParts
from chat.server.settings import ServerSettings
from chat.server.transport.backpressure import TimedStreamingResponse


async def _events():
    yield b"data: x\n\n"


def test_a_stream_is_server_sent_events_bounded_by_the_send_timeout():
    settings = ServerSettings(sessions_db=None, send_timeout_s=2.5)
    parts = ServerParts(None, settings, "fake", None, None, None, None, None, None)
    response = parts.stream(_events())
    assert isinstance(response, TimedStreamingResponse)
    assert response.media_type == "text/event-stream" and response.send_timeout_s == 2.5
