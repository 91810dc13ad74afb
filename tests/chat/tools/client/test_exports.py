"""The public names of chat.tools.client, pinned: adding or removing one is a deliberate change."""

from __future__ import annotations

import subprocess
import sys

import chat.tools.client

PUBLIC = {
    "AsyncChatClient", "ChatClient", "ReplyStream", "Reply",
    "Image", "Audio", "Video", "image_part", "audio_part", "video_part", "text_part", "to_content",
    "ClientError", "ChatError", "InvalidRequestError", "InvalidMediaError", "SessionError", "BusyError",
    "ContextOverflowError", "UnauthorizedError", "ServerError", "ChatConnectionError", "ConnectFailed",
    "ConnectionLost", "ChatTimeout", "MediaEncodingError", "UnexpectedServerEvent", "error_for",
}  # fmt: skip


def test_exports_are_pinned():
    assert set(chat.tools.client.__all__) == PUBLIC and len(chat.tools.client.__all__) == len(PUBLIC)
    for name in chat.tools.client.__all__:
        assert getattr(chat.tools.client, name) is not None, name


def test_importing_the_client_pulls_in_no_engine_and_no_media_libraries():
    code = "import sys; before = set(sys.modules); import chat.tools.client; print(*(set(sys.modules) - before))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "chat.tools.client.async_client" in loaded
    for module in ("torch", "chat.engine", "fastapi", "PIL", "numpy", "soundfile", "av"):
        assert module not in loaded, module
