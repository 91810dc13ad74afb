"""Anthropic's Messages API on the wire (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): the request, its
content blocks and tools, and the reply objects and stream events, as typed models (the shapes of the ``anthropic``
SDK's ``types``). Every model forbids fields it does not declare: an unknown field is a 400 naming it. Fields that
are declared but not honoured are refused by ``MessagesRequest.check`` unless absent or neutral (docs/anthropic.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from chat.protocol.client_events import ModelName
from chat.protocol.limits import MAX_MESSAGES, MAX_STOP_STRINGS, MAX_TEXT_CHARS
from chat.protocol.tools import MAX_TOOLS

MAX_BREAKPOINTS = 4  # cache_control blocks in one request (Anthropic's limit)


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- request ---------------------------------------------------------------------------------------------------


class CacheControl(Wire):
    """A prompt-caching breakpoint: the prefix up to the block that carries it is kept (``ttl``: 5 minutes by
    default, or 1 hour) after its last use."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None

    @property
    def ttl_s(self) -> int:
        return 3600 if self.ttl == "1h" else 300


class TextBlock(Wire):
    type: Literal["text"]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
    cache_control: CacheControl | None = None
    citations: Any = None  # refused unless null or empty


class Base64Source(Wire):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(Wire):
    type: Literal["url"]
    url: str  # an https URL (fetched when the server allows media URLs) or a data URL


class ImageBlock(Wire):
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None


ResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolUseBlock(Wire):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=128)]
    name: Annotated[str, Field(min_length=1, max_length=128)]
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: Any = None  # programmatic tool calling: refused unless null


class ToolResultBlock(Wire):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1, max_length=128)]
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(Wire):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # not verified (see docs/anthropic.md)
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(Wire):
    type: Literal["redacted_thinking"]
    data: str
    cache_control: CacheControl | None = None


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(Wire):
    role: Literal["user", "assistant", "system"]  # system: a mid-conversation system message (Claude Code's
    # mid-conversation-system beta); text blocks only
    content: str | list[ContentBlock]


class Tool(Wire):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: CacheControl | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None
    # Anthropic's tool fields this server does not honour: refused unless neutral
    defer_loading: bool | None = None
    input_examples: Any = None
    allowed_callers: Any = None
    eager_input_streaming: bool | None = None


class ToolChoiceAuto(Wire):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Wire):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Wire):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Wire):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class ThinkingEnabled(Wire):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1)]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(Wire):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(Wire):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")]


class Metadata(Wire):
    user_id: Annotated[str, Field(max_length=512)] | None = None  # accepted, not used


class ThinkingTurns(Wire):
    type: Literal["thinking_turns"]
    value: Annotated[int, Field(ge=1)]


class AllThinkingTurns(Wire):
    type: Literal["all"]


class ClearThinkingEdit(Wire):
    """Keep the thinking of the last ``keep`` assistant turns of the history (``"all"``: every turn's); the older
    turns' thinking blocks are dropped before the prompt is rendered."""

    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"] | Annotated[ThinkingTurns | AllThinkingTurns, Field(discriminator="type")] | None = None

    def turns_kept(self) -> int | None:
        """How many recent assistant turns keep their thinking (None: all). Anthropic's default is 1."""
        if self.keep is None:
            return 1
        if self.keep == "all" or isinstance(self.keep, AllThinkingTurns):
            return None
        return self.keep.value


class OtherEdit(Wire):
    """A context-management edit this server does not do (``clear_tool_uses_20250919``, ``compact_...``): refused."""

    model_config = ConfigDict(extra="allow")
    type: str


class ContextManagement(Wire):
    edits: list[ClearThinkingEdit | OtherEdit] | None = None


class JsonSchemaFormat(Wire):
    """Structured output: the reply's text is JSON matching ``schema`` (constrained as OpenAI's
    ``response_format: json_schema`` is)."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Wire):
    """``output_config``: ``effort`` is accepted and reported (``usage.turncache.effort``), not applied: a local
    model has no effort setting; ``format`` constrains the reply to a JSON schema."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonSchemaFormat | None = None


class MessagesRequest(Wire):
    """The body of ``POST /v1/messages``."""

    model: ModelName
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[MessageParam], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | list[TextBlock] | None = None
    metadata: Metadata | None = None
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    context_management: ContextManagement | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: both are honoured
    cache_control: CacheControl | None = None  # automatic caching: a breakpoint at the end of the prompt
    output_config: OutputConfig | None = None
    # Anthropic's fields this server does not honour: refused unless absent or neutral
    container: Any = None
    mcp_servers: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None


class CountTokensRequest(Wire):
    """The body of ``POST /v1/messages/count_tokens``: a message request without its reply settings."""

    model: ModelName
    messages: Annotated[list[MessageParam], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    context_management: ContextManagement | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    mcp_servers: Any = None


# --- reply -----------------------------------------------------------------------------------------------------


class PinOut(BaseModel):
    """What became of one ``cache_control`` breakpoint (``usage.turncache.breakpoints``, in prompt order)."""

    where: str  # the marked block ("system.2", "messages.0.content.3")
    tokens: int  # the prompt prefix it stands for
    ttl_s: int  # 300 or 3600
    pinned: bool  # held in the cache for ttl_s after its last use
    reason: str | None = None  # why not: not_cached, over_share, not_reached, cache_off (docs/anthropic.md)


class TurncacheUsage(BaseModel):
    """Our extra usage figures (``usage.turncache``): why the cache's reuse stopped early, what was capped, and what
    became of each breakpoint."""

    cache_miss_reason: str | None = None  # see docs/openai.md (the same reasons)
    cache_miss_at: int | None = None  # the prompt position it names
    max_tokens: int  # the reply's token cap as applied: the request's, or less where the context leaves less
    thinking: Literal["template", "unsupported", "off"] | None = None  # how a `thinking` request was honoured
    thinking_budget_tokens: int | None = None  # the thinking budget as applied (capped to the context)
    effort: Literal["not_applied"] | None = None  # output_config.effort was given: accepted, not applied
    breakpoints: list[PinOut] | None = None  # one per cache_control breakpoint, once the prompt is stored


class Usage(BaseModel):
    input_tokens: int  # prompt tokens neither read from the cache nor written up to the last breakpoint
    output_tokens: int
    cache_creation_input_tokens: int  # prompt tokens computed this request before the last breakpoint
    cache_read_input_tokens: int  # prompt tokens read from the cache
    cache_creation: dict[str, int] | None = None  # the same, per breakpoint TTL (ephemeral_5m/1h_input_tokens)
    service_tier: Literal["standard"] = "standard"
    turncache: TurncacheUsage


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Message(BaseModel):
    """A whole reply (``type: message``)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextOut | ThinkingOut | ToolUseOut]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: Usage


class ErrorObject(BaseModel):
    type: str  # invalid_request_error, authentication_error, ...
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorObject


class CountTokensResponse(BaseModel):
    input_tokens: int


# stream events: message_start, content_block_start / _delta / _stop, message_delta, message_stop, ping, error


class MessageStart(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: dict[str, Any]  # the Message so far: no content, no stop_reason, the prompt's usage


class BlockStart(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: dict[str, Any]  # text {"text": ""}, thinking {"thinking": "", "signature": ""}, tool_use


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(BaseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class InputJsonDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class BlockDelta(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class BlockStop(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(BaseModel):
    stop_reason: StopReason | None
    stop_sequence: str | None = None


class MessageDelta(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: Usage


class MessageStop(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class Ping(BaseModel):
    type: Literal["ping"] = "ping"


StreamEvent = MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop | Ping | ErrorResponse
