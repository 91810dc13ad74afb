"""The eval dataset: one conversation per JSONL line (the format is specified in docs/eval.md).

::

    {"id": "capitals", "system": "Answer with one word.", "sampling": {"max_tokens": 16},
     "messages": [{"role": "user", "content": "Capital of France?"},
                  {"role": "assistant", "reference": "Paris"},
                  {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                               {"type": "image", "path": "media/cat.png"}]}]}

:func:`load_dataset` never raises for a bad line: it returns a :class:`BadLine` in its place, so the run goes on and
reports it. Media paths are resolved relative to the dataset file; :func:`missing_media` and :func:`turn_content`
read them only when the conversation runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from chat.protocol.sampling import SamplingSettings
from chat.tools.client.media import audio_part, image_part, text_part, video_part

MAX_ID_CHARS = 128  # a conversation id (the key for resuming)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TextItem(_Strict):
    type: Literal["text"]
    text: str


class MediaItem(_Strict):
    type: Literal["image", "audio", "video"]
    path: Annotated[str, Field(min_length=1)]  # relative to the dataset file, or absolute


Item = Annotated[TextItem | MediaItem, Field(discriminator="type")]


def _content_kind(value: Any) -> str | None:
    return "str" if isinstance(value, str) else "list" if isinstance(value, list) else None


Content = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[Item], Field(min_length=1), Tag("list")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="content must be a string or a list of parts",
    ),
]


class UserMessage(_Strict):
    role: Literal["user"]
    content: Content


class AssistantMessage(_Strict):
    """Stands for the model's reply to the user message before it; never sent. ``reference``: the expected reply
    (or several acceptable ones), for exact match."""

    role: Literal["assistant"]
    reference: str | Annotated[list[str], Field(min_length=1)] | None = None


Message = Annotated[UserMessage | AssistantMessage, Field(discriminator="role")]


class ConversationSpec(_Strict):
    id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
    system: str | None = None
    sampling: SamplingSettings | None = None
    messages: Annotated[list[Message], Field(min_length=1)]

    @model_validator(mode="after")
    def _user_turns(self) -> ConversationSpec:
        previous = "assistant"
        for message in self.messages:
            if message.role == "assistant" and previous == "assistant":
                raise PydanticCustomError("message_order", "messages: an assistant message must follow a user message")
            previous = message.role
        return self


@dataclass(frozen=True, slots=True)
class EvalTurn:
    """One user message to send, and what its reply should be."""

    index: int  # 0-based among the conversation's user messages
    content: str | tuple[TextItem | MediaItem, ...]  # as in the dataset; media still as paths
    references: tuple[str, ...] | None  # acceptable replies; None: no reference for this turn


@dataclass(frozen=True, slots=True)
class EvalConversation:
    id: str  # the dataset's id; the key for resuming
    line: int  # 1-based line in the dataset file
    system: str | None  # the system prompt
    sampling: dict[str, Any] | None  # the sampling fields the dataset gave (others: the server's defaults)
    turns: tuple[EvalTurn, ...]  # one per user message, in order


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that is not a usable conversation. Reported as a one-turn conversation that failed."""

    id: str  # the line's id if it has a usable one, else "@line<N>"; a duplicate id gets "<id>@line<N>"
    line: int  # 1-based line in the dataset file
    error: str  # what is wrong, with the field path

    @property
    def turns(self) -> tuple[EvalTurn, ...]:
        return ()


Entry = EvalConversation | BadLine


def load_dataset(path: Path) -> list[Entry]:
    """Every non-blank line of ``path``, parsed.

    Raises:
        OSError: the file cannot be read. UnicodeDecodeError: it is not UTF-8.
    """
    entries: list[Entry] = []
    first_line: dict[str, int] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        entry = parse_line(text, number)
        if entry.id in first_line:
            entry = BadLine(f"{entry.id}@line{number}", number, f"duplicate id (first on line {first_line[entry.id]})")
        first_line.setdefault(entry.id, number)
        entries.append(entry)
    return entries


def parse_line(text: str, line: int) -> Entry:
    """One dataset line -> a conversation, or a :class:`BadLine` saying what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadLine(f"@line{line}", line, f"not valid JSON: {exc}")
    given = data.get("id") if isinstance(data, dict) else None
    fallback = given if isinstance(given, str) and 0 < len(given) <= MAX_ID_CHARS else f"@line{line}"
    try:
        spec = ConversationSpec.model_validate(data)
    except ValidationError as exc:
        return BadLine(fallback, line, _describe(exc))
    return _conversation(spec, line)


def media_paths(conversation: EvalConversation, base: Path) -> list[Path]:
    """Every media file the conversation names, resolved against ``base`` (the dataset's directory)."""
    return [
        base / item.path
        for turn in conversation.turns
        if not isinstance(turn.content, str)
        for item in turn.content
        if isinstance(item, MediaItem)
    ]


def missing_media(conversation: EvalConversation, base: Path) -> list[Path]:
    return [p for p in media_paths(conversation, base) if not p.is_file()]


def turn_content(turn: EvalTurn, base: Path) -> str | list[dict[str, Any]]:
    """The turn's content as wire parts (media read and base64-encoded).

    Raises:
        MediaEncodingError: a file cannot be read or its format is not recognized.
    """
    if isinstance(turn.content, str):
        return turn.content
    encode = {"image": image_part, "audio": audio_part, "video": video_part}
    return [
        text_part(item.text) if isinstance(item, TextItem) else encode[item.type](base / item.path)
        for item in turn.content
    ]


# ---------------------------------------------------------------- internals


def _conversation(spec: ConversationSpec, line: int) -> EvalConversation:
    turns: list[EvalTurn] = []
    for message in spec.messages:
        if isinstance(message, UserMessage):
            content = message.content if isinstance(message.content, str) else tuple(message.content)
            turns.append(EvalTurn(len(turns), content, None))
        elif message.reference is not None:
            refs = (message.reference,) if isinstance(message.reference, str) else tuple(message.reference)
            last = turns[-1]
            turns[-1] = EvalTurn(last.index, last.content, refs)
    sampling = spec.sampling.model_dump(exclude_unset=True) if spec.sampling is not None else None
    return EvalConversation(spec.id, line, spec.system, sampling, tuple(turns))


_TAGS = frozenset({"user", "assistant", "text", "image", "audio", "video"})  # union tags pydantic puts in paths


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    parts = []
    for error in errors[:3]:
        where = _path(error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    if len(errors) > 3:
        parts.append(f"and {len(errors) - 3} more")
    return "; ".join(parts)


def _path(loc: tuple[int | str, ...]) -> str:
    """``messages.0.content.1.path``, without the union tags pydantic inserts (``user``, ``list``, ``image``)."""
    out = []
    for i, item in enumerate(loc):
        if i >= 2 and isinstance(loc[i - 1], int) and loc[i - 2] in ("messages", "list") and item in _TAGS:
            continue
        if i >= 1 and loc[i - 1] == "content" and item in ("str", "list"):
            continue
        out.append(str(item))
    return ".".join(out)
