"""The public names of chat.protocol, pinned: adding or removing one is a deliberate change."""

from __future__ import annotations

import subprocess
import sys

import chat.protocol

PUBLIC = {
    # wire types: client events and their union
    "ClientEvent", "CLIENT_EVENT_TYPES", "SessionCreate", "SessionResume", "SessionUpdate", "TurnCreate", "TurnCancel",
    "TurnRegenerate", "TurnEdit", "ConversationGet", "CompletionCreate", "Ping", "ToolResults", "ToolResult",
    # wire types: server events and their union
    "ServerEvent", "SERVER_EVENT_TYPES", "SessionCreated", "SessionResumed", "SessionUpdated", "SessionInfo",
    "TurnStarted", "ReplyDelta", "ReplyDone", "Usage", "PromptTokensDetails", "Timings", "Conversation", "ErrorEvent",
    "Pong", "ReplyToolCall",
    # content and settings
    "Content", "ContentPart", "TextPart", "ImageURLPart", "ImageURL", "InputAudioPart", "InputAudio", "VideoURLPart",
    "VideoURL", "ChatMessage", "ConversationMessage", "FinishReason", "SamplingSettings", "MediaContentPart",
    "MediaText", "PromptMessage",
    # errors, parsing, state
    "ErrorCode", "ProtocolError", "parse_client_event", "parse_server_event", "serialize_server_event",
    "Session", "SessionState", "TurnPlan", "plan_completion", "SessionStore", "InMemorySessionStore", "Connection",
    "Step",
}  # fmt: skip


def test_exports_are_pinned():
    assert set(chat.protocol.__all__) == PUBLIC
    assert len(chat.protocol.__all__) == len(PUBLIC)


def test_every_export_exists():
    for name in chat.protocol.__all__:
        assert getattr(chat.protocol, name) is not None, name


def test_the_protocol_layer_does_no_io():
    """Importing the package pulls in no transport, no event loop and not the engine (torch)."""
    code = "import sys; before = set(sys.modules); import chat.protocol; print(*(set(sys.modules) - before))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "chat.protocol.session" in loaded  # the probe works
    for module in ("asyncio", "websockets", "fastapi", "starlette", "torch", "chat.engine"):
        assert module not in loaded, module
