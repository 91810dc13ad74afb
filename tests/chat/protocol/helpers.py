"""Shared test data for the protocol tests: predictable ids, media, one example of every event; a client frame
made (`event`) and refused (`refusal`)."""

from __future__ import annotations

import itertools
import json

import pytest

from chat.protocol import (
    ClientEvent,
    CompletionCreate,
    Conversation,
    ConversationGet,
    ConversationMessage,
    ErrorCode,
    ErrorEvent,
    Ping,
    Pong,
    ProtocolError,
    ReplyDelta,
    ReplyDone,
    ReplyToolCall,
    SamplingSettings,
    ServerEvent,
    SessionCreate,
    SessionCreated,
    SessionInfo,
    SessionResume,
    SessionResumed,
    SessionUpdate,
    SessionUpdated,
    Timings,
    ToolResults,
    TurnCancel,
    TurnCreate,
    TurnEdit,
    TurnRegenerate,
    TurnStarted,
    Usage,
    parse_client_event,
)
from chat.protocol.content import to_wire
from chat.protocol.ids import IdFactory
from chat.protocol.tools import AssistantToolCall

PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
IMAGE_PART = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}
AUDIO_PART = {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}}
VIDEO_PART = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAAIGZ0eXBpc29t"}}
TEXT_PART = {"type": "text", "text": "What is in this picture?"}


def plan_json(plan) -> tuple[dict, ...]:
    """A plan's messages as OpenAI-shaped JSON (what they were before they kept their validated parts)."""
    return tuple({"role": m.role, "content": to_wire(m.content)} for m in plan.messages)


def counter_ids() -> IdFactory:
    """An id factory giving sess_1, turn_2, msg_3, ... (one counter for all prefixes)."""
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(counter)}"


SAMPLING = SamplingSettings(temperature=0.7, top_p=0.9, top_k=40, seed=7, max_tokens=64, stop=["\n\n"])
USAGE = Usage.of(prompt_tokens=120, completion_tokens=8, cached_tokens=96)
TIMINGS = Timings(ttft_ms=41.5, decode_tokens_per_s=21.3, total_ms=370.0, prefill_ms=30.1)
INFO = SessionInfo(id="sess_1", model="m", system="Be brief.", sampling=SAMPLING, messages=2, state="idle")

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
CALL = AssistantToolCall.model_validate(
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
)

CLIENT_EXAMPLES: list[ClientEvent] = [
    SessionCreate(event_id="e1", model="m", system="Be brief.", sampling=SAMPLING),
    SessionCreate(),
    SessionResume(event_id="e2", session_id="sess_1"),
    SessionUpdate(event_id="e3", system=None, sampling=SamplingSettings(temperature=1.0)),
    TurnCreate(event_id="e4", content="Hello"),
    TurnCreate.model_validate({"content": [TEXT_PART, IMAGE_PART, AUDIO_PART, VIDEO_PART]}),
    TurnCancel(event_id="e5", turn_id="turn_2"),
    TurnCancel(),
    TurnRegenerate(event_id="e6"),
    TurnEdit(event_id="e7", index=0, content="Hi"),
    TurnEdit(message_id="msg_3", content="Hi"),
    ConversationGet(event_id="e8"),
    CompletionCreate.model_validate(
        {
            "event_id": "e9",
            "model": "m",
            "sampling": {"temperature": 0, "max_tokens": 16},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [TEXT_PART, IMAGE_PART]},
                {"role": "assistant", "content": "A red pixel."},
                {"role": "user", "content": "And its size?"},
            ],
        }
    ),
    Ping(event_id="e10"),
    TurnCreate.model_validate({"event_id": "e11", "content": "Weather?", "tools": [TOOL], "tool_choice": "required"}),
    ToolResults.model_validate(
        {"event_id": "e12", "results": [{"tool_call_id": "call_1", "content": "sunny"}], "tools": [TOOL]}
    ),
]

SERVER_EXAMPLES: list[ServerEvent] = [
    SessionCreated(reply_to="e1", session=INFO),
    SessionResumed(reply_to="e2", session=INFO),
    SessionUpdated(session=INFO),
    TurnStarted(reply_to="e4", turn_id="turn_2", session_id="sess_1", kind="create", user_message_id="msg_3"),
    TurnStarted(turn_id="turn_9", kind="completion"),
    ReplyDelta(reply_to="e4", turn_id="turn_2", delta="Hel", token_ids=[12, 34]),
    ReplyDelta(turn_id="turn_2", delta="lo"),
    ReplyDone(
        reply_to="e4",
        turn_id="turn_2",
        message_id="msg_4",
        text="Hello",
        finish_reason="stop",
        usage=USAGE,
        timings=TIMINGS,
    ),
    ReplyDone(turn_id="turn_2", text="", finish_reason="cancelled", usage=Usage.of(5, 0), timings=Timings()),
    Conversation(
        reply_to="e8",
        session_id="sess_1",
        messages=[
            ConversationMessage(id="msg_3", role="user", content="Hello"),
            ConversationMessage(id="msg_4", role="assistant", content="Hi!", finish_reason="stop"),
        ],
        generating=None,
    ),
    ErrorEvent(reply_to="e4", code=ErrorCode.BUSY, message="session sess_1 is generating turn turn_2"),
    ErrorEvent(code=ErrorCode.CONTEXT_OVERFLOW, message="too long", turn_id="turn_2"),
    Pong(reply_to="e10"),
    ReplyToolCall(reply_to="e11", turn_id="turn_3", index=0, call=CALL),
    ReplyDone(
        reply_to="e11",
        turn_id="turn_3",
        message_id="msg_6",
        text="",
        finish_reason="tool_calls",
        usage=USAGE,
        timings=TIMINGS,
        tool_calls=[CALL],
    ),
]


def refusal(raw: str | bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_event(raw)
    return info.value


def event(**fields) -> str:
    return json.dumps(fields)
