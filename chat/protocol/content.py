"""Message content as in OpenAI chat completions: a string, or a list of typed parts.

Parts::

    {"type": "text", "text": "..."}
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}

Media travels inline, base64-encoded: only ``data:`` URLs are accepted (the server never fetches a URL). This module
checks the form (data URL of the right kind, valid base64, non-empty); decoding the bytes into pixels, samples or
frames is the job of ``modalities/``, which reports ``invalid_media`` for content it cannot read.
"""

from __future__ import annotations

import binascii
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from chat.protocol.base import WireModel
from chat.protocol.limits import (
    MAX_MEDIA_PER_TURN,
    MAX_PARTS_PER_MESSAGE,
    MAX_TEXT_CHARS,
    AudioFormat,
)

INVALID_MEDIA = "invalid_media"  # the pydantic error type that the parser maps to ErrorCode.INVALID_MEDIA
_DATA_URL = re.compile(r"data:(?P<kind>[a-z]+)/[A-Za-z0-9.+-]+;base64,", re.ASCII)

FinishReason = Literal["stop", "length", "cancelled", "error"]
Role = Literal["system", "user", "assistant"]


def _check_base64(data: str, what: str) -> str:
    if not data:
        raise PydanticCustomError(INVALID_MEDIA, "{what} is empty", {"what": what})
    try:
        binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError(INVALID_MEDIA, "{what} is not valid base64", {"what": what}) from None
    return data


def _check_data_url(url: str, kind: str) -> str:
    match = _DATA_URL.match(url)
    if match is None or match["kind"] != kind:
        raise PydanticCustomError(
            INVALID_MEDIA, "expected a data URL 'data:{kind}/<subtype>;base64,<data>'", {"kind": kind}
        )
    _check_base64(url[match.end() :], f"the {kind} data")
    return url


class TextPart(WireModel):
    type: Literal["text"] = "text"
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class ImageURL(WireModel):
    url: str  # data:image/<subtype>;base64,<data>
    detail: Literal["auto", "low", "high"] | None = None  # accepted for OpenAI compatibility; ignored

    @field_validator("url")
    @classmethod
    def _image_data_url(cls, url: str) -> str:
        return _check_data_url(url, "image")


class ImageURLPart(WireModel):
    type: Literal["image_url"] = "image_url"
    image_url: ImageURL


class InputAudio(WireModel):
    data: str  # base64 of the file's bytes (no data: prefix, as in OpenAI)
    format: AudioFormat  # the container, e.g. "wav"

    @field_validator("data")
    @classmethod
    def _base64(cls, data: str) -> str:
        return _check_base64(data, "the audio data")


class InputAudioPart(WireModel):
    type: Literal["input_audio"] = "input_audio"
    input_audio: InputAudio


class VideoURL(WireModel):
    url: str  # data:video/<subtype>;base64,<data>

    @field_validator("url")
    @classmethod
    def _video_data_url(cls, url: str) -> str:
        return _check_data_url(url, "video")


class VideoURLPart(WireModel):
    type: Literal["video_url"] = "video_url"
    video_url: VideoURL


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


def media_parts(content: str | list[Any]) -> list[MediaContentPart]:
    """The image / audio / video parts of ``content``, in order."""
    if isinstance(content, str):
        return []
    return [p for p in content if isinstance(p, ImageURLPart | InputAudioPart | VideoURLPart)]


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
    """One message of a ``completion.create`` list. Media is allowed in user messages only."""

    role: Role
    content: Content

    @model_validator(mode="after")
    def _media_only_from_users(self) -> ChatMessage:
        if self.role != "user" and media_parts(self.content):
            raise PydanticCustomError(
                INVALID_MEDIA, "only user messages may hold media, not {role}", {"role": self.role}
            )
        return self


StoredContent = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[ContentPart], Tag("list")],
    Discriminator(_content_kind),
]
"""Content the server stores and sends back: no length limits (a reply may be longer than a client message)."""


class ConversationMessage(WireModel):
    """One message of a session's conversation, as the ``conversation`` event lists it."""

    id: str  # "msg_..."; turn.edit may name it
    role: Literal["user", "assistant"]
    content: StoredContent  # user messages: as sent; replies: a string
    finish_reason: FinishReason | None = None  # assistant messages: why the reply ended ("stop", "length", "cancelled")


def to_wire(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """``content`` as plain JSON-ready data (what a chat template receives)."""
    if isinstance(content, str):
        return content
    return [p.model_dump(exclude_none=True) for p in content]
