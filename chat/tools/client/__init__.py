"""A Python client for turncache's chat WebSocket (``/v1/ws``, see docs/protocol.md).

- :class:`AsyncChatClient` for asyncio code; turns are :class:`ReplyStream` objects (iterate for text deltas, or
  await for the :class:`Reply`).
- :class:`ChatClient`, the same operations blocking, on a private event loop in a thread.
- Media for a user turn: paths, bytes, PIL images, or :class:`Audio` samples; :mod:`chat.tools.client.media` turns them
  into OpenAI-style content parts (data URLs, base64 ``input_audio``).
- Errors: one tree under :class:`ClientError` (see :mod:`chat.tools.client.errors`): :class:`ChatError` and its
  subclasses for the server's ``error`` events (``.code`` is the wire code), :class:`ChatConnectionError` for the
  transport.

Example::

    from pathlib import Path
    from chat.tools.client import ChatClient

    with ChatClient("ws://127.0.0.1:8000/v1/ws") as client:
        client.create_session(system="You are concise.", sampling={"max_tokens": 64})
        print(client.send("Describe this image.", Path("cat.png")).text)
"""

from __future__ import annotations

from chat.tools.client.async_client import AsyncChatClient, ReplyStream
from chat.tools.client.errors import (
    BusyError,
    ChatConnectionError,
    ChatError,
    ChatTimeout,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    ContextOverflowError,
    InvalidMediaError,
    InvalidRequestError,
    MediaEncodingError,
    ServerError,
    SessionError,
    UnauthorizedError,
    UnexpectedServerEvent,
    error_for,
)
from chat.tools.client.media import Audio, Image, Video, audio_part, image_part, text_part, to_content, video_part
from chat.tools.client.reply import Reply
from chat.tools.client.sync_client import ChatClient

__all__ = [
    "AsyncChatClient",
    "Audio",
    "BusyError",
    "ChatClient",
    "ChatConnectionError",
    "ChatError",
    "ChatTimeout",
    "ClientError",
    "ConnectFailed",
    "ConnectionLost",
    "ContextOverflowError",
    "Image",
    "InvalidMediaError",
    "InvalidRequestError",
    "MediaEncodingError",
    "Reply",
    "ReplyStream",
    "ServerError",
    "SessionError",
    "UnauthorizedError",
    "UnexpectedServerEvent",
    "Video",
    "audio_part",
    "error_for",
    "image_part",
    "text_part",
    "to_content",
    "video_part",
]
