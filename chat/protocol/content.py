"""Message content as in OpenAI chat completions: a string, or a list of typed parts. The one description of it, for
both transports: the WebSocket protocol and the OpenAI-compatible HTTP API (``chat/server/surfaces/openai_api.py``).

Parts::

    {"type": "text", "text": "..."}
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}

Media travels inline, base64-encoded: only ``data:`` URLs are accepted here. (A server that lists media hosts fetches
their ``https://`` image URLs and inlines them before validation: ``chat.server.transport.media_urls``.) Validating
a media part reads its data URL header (:func:`modalities.identity.parse_data_url`), decodes its base64 (strict:
the padded alphabet only) and hashes the bytes once (:func:`modalities.identity.media_digest`); the part keeps the
digest (:class:`MediaText`), and
:meth:`ImageURLPart.media` (etc.) hands the engine a :class:`modalities.parts.MediaInput` that carries it, so a
stored message's items are never decoded or hashed again for a later turn. Decoding the bytes into pixels, samples
or frames is the job of ``modalities/``, which reports ``invalid_media`` for content it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from chat.protocol.base import WireModel
from chat.protocol.limits import (
    MAX_MEDIA_PER_CONVERSATION,
    MAX_MEDIA_PER_TURN,
    MAX_PARTS_PER_MESSAGE,
    MAX_TEXT_CHARS,
    AudioFormat,
)
from chat.protocol.tools import MAX_TOOL_CALLS, AssistantToolCall
from modalities import identity
from modalities.errors import MediaError
from modalities.identity import MediaDigest
from modalities.parts import Base64Text, MediaInput

INVALID_MEDIA = "invalid_media"  # the pydantic error type that the transports report as ErrorCode.INVALID_MEDIA

FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]
Role = Literal["system", "user", "assistant"]
PromptRole = Literal["system", "user", "assistant", "tool"]


class MediaText(str):
    """Validated media text, a data URL or bare base64 (audio), that keeps what validating it learned: the digest of
    its bytes and where its base64 starts. It serializes as the plain string it is."""

    digest: MediaDigest  # sha256 of the decoded bytes
    start: int  # where the base64 begins
    declared: str | None  # the data URL's MIME type (None for bare base64)

    @classmethod
    def checked(cls, text: str, kind: str, *, data_url: bool) -> MediaText:
        """``text`` validated as media of ``kind``: its base64 decoded (strict) and its bytes hashed, once.

        Raises:
            PydanticCustomError: ``invalid_media``, saying what is wrong.
        """
        declared, start = _read_data_url(text, kind) if data_url else (None, 0)
        try:
            data = identity.decode_base64(text[start:], strict=True)
        except MediaError:
            raise PydanticCustomError(INVALID_MEDIA, "the {kind} data is not valid base64", {"kind": kind}) from None
        if not data:
            raise PydanticCustomError(INVALID_MEDIA, "the {kind} data is empty", {"kind": kind})
        out = cls(text)
        out.digest, out.start, out.declared = identity.media_digest(data), start, declared
        return out

    def media(self, kind: str, declared: str | None, item: str) -> MediaInput:
        """The engine's view of this media (no decoding, no hashing); ``item`` names it in errors."""
        return MediaInput(kind, self.digest, Base64Text(self, self.start), declared, item)


def _read_data_url(url: str, kind: str) -> tuple[str, int]:
    """Check the header of ``url``: a base64 data URL of ``kind``. Return its MIME type and where its base64 starts."""
    expected = "expected a data URL 'data:{kind}/<subtype>;base64,<data>'"
    if url[:8].lower().startswith(("https://", "http://")):  # media_urls inlines the URLs it may fetch before this
        message = expected + ": this server does not fetch this URL (media by URL is opt-in: --media-url-host)"
        raise PydanticCustomError(INVALID_MEDIA, message, {"kind": kind})
    try:
        header = identity.parse_data_url(url[: url.find(",") + 1] if "," in url else url)  # the header only
    except MediaError as exc:
        context = {"kind": kind, "detail": exc.detail}
        raise PydanticCustomError(INVALID_MEDIA, expected + ": {detail}", context) from None
    if header.mime.partition("/")[0] != kind:
        raise PydanticCustomError(INVALID_MEDIA, expected, {"kind": kind})
    return header.mime, url.index(",") + 1


def _media(kind: str, *, data_url: bool) -> AfterValidator:
    return AfterValidator(lambda text: MediaText.checked(text, kind, data_url=data_url))


class TextPart(WireModel):
    type: Literal["text"] = "text"
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class _MediaPart(WireModel):
    """A content part that holds media: :meth:`media` hands it to the engine."""

    def payload(self) -> tuple[MediaText, str, str | None]:
        """(validated payload, kind, declared format)."""
        raise NotImplementedError

    def media(self, item: str) -> MediaInput:
        """The engine's view of this part (no decoding, no hashing); ``item`` names it in errors."""
        text, kind, declared = self.payload()
        assert isinstance(text, MediaText), "media parts are made by validation"
        return text.media(kind, declared, item)


class ImageURL(WireModel):
    url: Annotated[str, _media("image", data_url=True)]  # data:image/<subtype>;base64,<data>
    detail: Literal["auto", "low", "high"] | None = None  # accepted for OpenAI compatibility; ignored


class ImageURLPart(_MediaPart):
    type: Literal["image_url"] = "image_url"
    image_url: ImageURL

    def payload(self) -> tuple[MediaText, str, str | None]:
        url = self.image_url.url
        return url, "image", getattr(url, "declared", None)  # type: ignore[return-value]


class InputAudio(WireModel):
    data: Annotated[str, _media("audio", data_url=False)]  # base64 of the file's bytes (no data: prefix, as in OpenAI)
    format: AudioFormat  # the container, e.g. "wav"


class InputAudioPart(_MediaPart):
    type: Literal["input_audio"] = "input_audio"
    input_audio: InputAudio

    def payload(self) -> tuple[MediaText, str, str | None]:
        return self.input_audio.data, "audio", self.input_audio.format  # type: ignore[return-value]


class VideoURL(WireModel):
    url: Annotated[str, _media("video", data_url=True)]  # data:video/<subtype>;base64,<data>


class VideoURLPart(_MediaPart):
    type: Literal["video_url"] = "video_url"
    video_url: VideoURL

    def payload(self) -> tuple[MediaText, str, str | None]:
        url = self.video_url.url
        return url, "video", getattr(url, "declared", None)  # type: ignore[return-value]


ContentPart = Annotated[TextPart | ImageURLPart | InputAudioPart | VideoURLPart, Field(discriminator="type")]
MediaContentPart = ImageURLPart | InputAudioPart | VideoURLPart  # a wire part holding media


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "str"
    if isinstance(value, list | tuple):
        return "list"
    return None


def _check_text_total(content: str | list[Any]) -> str | list[Any]:
    if isinstance(content, list) and sum(len(p.text) for p in content if isinstance(p, TextPart)) > MAX_TEXT_CHARS:
        raise PydanticCustomError("too_long", "the text parts hold more than {n} characters", {"n": MAX_TEXT_CHARS})
    return content


Content = Annotated[
    Annotated[Annotated[str, Field(max_length=MAX_TEXT_CHARS)], Tag("str")]
    | Annotated[list[ContentPart], Field(min_length=1, max_length=MAX_PARTS_PER_MESSAGE), Tag("list")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="content must be a string or a list of content parts",
    ),
    AfterValidator(_check_text_total),
]
"""A message's content: a string, or 1..MAX_PARTS_PER_MESSAGE parts holding at most MAX_TEXT_CHARS of text."""


def media_parts(content: str | list[Any] | None) -> list[MediaContentPart]:
    """The image / audio / video parts of ``content``, in order."""
    if content is None or isinstance(content, str):
        return []
    return [p for p in content if isinstance(p, _MediaPart)]


def is_blank(content: str | list[Any]) -> bool:
    """True when ``content`` holds no media and only whitespace text."""
    if isinstance(content, str):
        return not content.strip()
    return not media_parts(content) and all(not p.text.strip() for p in content if isinstance(p, TextPart))


def _check_turn_content(content: str | list[Any]) -> str | list[Any]:
    if is_blank(content):
        raise PydanticCustomError("blank", "the message is empty")
    if len(media_parts(content)) > MAX_MEDIA_PER_TURN:
        raise PydanticCustomError("too_many_media", "more than {n} media items in one turn", {"n": MAX_MEDIA_PER_TURN})
    return content


UserContent = Annotated[Content, AfterValidator(_check_turn_content)]
"""The content of a new user turn: not blank, at most MAX_MEDIA_PER_TURN media items."""


class ChatMessage(WireModel):
    """One message of a ``completion.create`` list (the HTTP API's messages extend it). Media is allowed in user
    messages only; an assistant message may carry the ``tool_calls`` its reply made, a ``tool`` message the
    ``tool_call_id`` of the call it answers (and only these: :func:`check_tool_messages` checks the list)."""

    role: PromptRole
    content: Content
    tool_calls: Annotated[list[AssistantToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None  # assistant's
    tool_call_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None  # a tool result's call

    @model_validator(mode="after")
    def _media_only_from_users(self) -> ChatMessage:
        if self.role != "user" and self.content is not None and media_parts(self.content):
            raise PydanticCustomError(
                INVALID_MEDIA, "only user messages may hold media, not {role}", {"role": self.role}
            )
        return self

    @model_validator(mode="after")
    def _tool_fields_where_they_belong(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("tool_calls", "only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise PydanticCustomError("tool_call_id", "a tool message needs tool_call_id (and only a tool message)")
        return self

    def prompt(self) -> PromptMessage:
        """The message for a turn's prompt (a missing content is empty)."""
        content = "" if self.content is None else self.content
        role = "system" if self.role == "developer" else self.role
        return PromptMessage(role, content, tuple(self.tool_calls or ()), self.tool_call_id)  # type: ignore[arg-type]


def check_tool_messages(messages: list[Any]) -> None:
    """Refuse a message list in which a ``tool`` message answers no call of an earlier assistant message (the rule
    of ``/v1/chat/completions``): a pydantic custom error naming the message, for a model validator."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        calls.update(call.id for call in m.tool_calls or ())
        if m.role == "tool" and m.tool_call_id not in calls:
            raise PydanticCustomError(
                "tool_call_id", "messages.{i}.tool_call_id answers no call of an earlier assistant message", {"i": i}
            )


def check_media_count(messages: list[Any]) -> None:
    """Refuse a message list (``completion.create``, an HTTP request) holding more than MAX_MEDIA_PER_CONVERSATION
    media items: a pydantic custom error, for a model validator."""
    if sum(len(media_parts(m.content)) for m in messages) > MAX_MEDIA_PER_CONVERSATION:
        raise PydanticCustomError(
            "too_many_media", "more than {n} media items in one conversation", {"n": MAX_MEDIA_PER_CONVERSATION}
        )


StoredContent = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[ContentPart], Tag("list")],
    Discriminator(_content_kind),
]
"""Content the server stores and sends back: no length limits (a reply may be longer than a client message)."""


class ConversationMessage(WireModel):
    """One message of a session's conversation, as the ``conversation`` event lists it."""

    id: str  # "msg_..."; turn.edit may name it
    role: Literal["user", "assistant", "tool"]
    content: StoredContent  # user messages: as sent; replies: a string (the text besides their calls); tool results
    finish_reason: FinishReason | None = None  # assistant messages: why the reply ended ("stop", "length",
    # "tool_calls", "cancelled")
    tool_calls: list[AssistantToolCall] | None = None  # assistant messages: the calls the reply made
    tool_call_id: str | None = None  # tool messages: the call this result answers


def to_wire(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """``content`` as plain JSON-ready data (what a chat template receives)."""
    if isinstance(content, str):
        return content
    return [p.model_dump(exclude_none=True) for p in content]


@dataclass(frozen=True, slots=True)
class PromptMessage:
    """One message of a prompt for the engine: a role and validated content, whose media parts carry their digests
    (see the module docstring). A :class:`~chat.protocol.session.TurnPlan` holds these; the transports turn them
    into the engine's messages (``chat.server.reply.turns.engine_messages``)."""

    role: PromptRole  # "system", "user", "assistant" or "tool"
    content: str | list[Any]  # a string, or TextPart / media parts as validated
    tool_calls: tuple[AssistantToolCall, ...] = ()  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message's call
