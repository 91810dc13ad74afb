"""The chat protocol, sans I/O: wire types, the frame parser, the session state machine, the session store.

No sockets, no asyncio, no web framework: a transport (``chat/server``) feeds frames to a :class:`Connection` and
engine results back to it, and sends the events it returns. See ``docs/protocol.md`` for the wire format.

Modules: ``limits`` (every limit), ``errors`` (``ProtocolError``, ``ErrorCode``), ``content`` (message parts),
``sampling``, ``client_events``, ``server_events``, ``parser``, ``session`` (``Session``, ``TurnPlan``), ``store``,
``connection``.
"""

from __future__ import annotations

from chat.protocol.client_events import (
    CLIENT_EVENT_TYPES,
    ClientEvent,
    CompletionCreate,
    ConversationGet,
    Ping,
    SessionCreate,
    SessionResume,
    SessionUpdate,
    TurnCancel,
    TurnCreate,
    TurnEdit,
    TurnRegenerate,
)
from chat.protocol.connection import Connection, Step
from chat.protocol.content import (
    ChatMessage,
    Content,
    ContentPart,
    ConversationMessage,
    FinishReason,
    ImageURL,
    ImageURLPart,
    InputAudio,
    InputAudioPart,
    MediaContentPart,
    MediaText,
    PromptMessage,
    TextPart,
    VideoURL,
    VideoURLPart,
)
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.parser import parse_client_event, parse_server_event, serialize_server_event
from chat.protocol.sampling import SamplingSettings
from chat.protocol.server_events import (
    SERVER_EVENT_TYPES,
    Conversation,
    ErrorEvent,
    Pong,
    PromptTokensDetails,
    ReplyDelta,
    ReplyDone,
    ServerEvent,
    SessionCreated,
    SessionInfo,
    SessionResumed,
    SessionUpdated,
    Timings,
    TurnStarted,
    Usage,
)
from chat.protocol.session import Session, SessionState, TurnPlan, plan_completion
from chat.protocol.store import InMemorySessionStore, SessionStore

__all__ = [
    "CLIENT_EVENT_TYPES",
    "SERVER_EVENT_TYPES",
    "ChatMessage",
    "ClientEvent",
    "CompletionCreate",
    "Connection",
    "Content",
    "ContentPart",
    "Conversation",
    "ConversationGet",
    "ConversationMessage",
    "ErrorCode",
    "ErrorEvent",
    "FinishReason",
    "ImageURL",
    "ImageURLPart",
    "InMemorySessionStore",
    "InputAudio",
    "InputAudioPart",
    "MediaContentPart",
    "MediaText",
    "Ping",
    "Pong",
    "PromptMessage",
    "PromptTokensDetails",
    "ProtocolError",
    "ReplyDelta",
    "ReplyDone",
    "SamplingSettings",
    "ServerEvent",
    "Session",
    "SessionCreate",
    "SessionCreated",
    "SessionInfo",
    "SessionResume",
    "SessionResumed",
    "SessionState",
    "SessionStore",
    "SessionUpdate",
    "SessionUpdated",
    "Step",
    "TextPart",
    "Timings",
    "TurnCancel",
    "TurnCreate",
    "TurnEdit",
    "TurnPlan",
    "TurnRegenerate",
    "TurnStarted",
    "Usage",
    "VideoURL",
    "VideoURLPart",
    "parse_client_event",
    "parse_server_event",
    "plan_completion",
    "serialize_server_event",
]
