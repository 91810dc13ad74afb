"""OpenAI's Responses API on the wire (``POST /v1/responses``, ``GET /v1/responses/{id}``): the response object
(:class:`Response`), its output items (a message of ``output_text``, reasoning, function calls), its usage, and the
stream's events (:class:`EventWriter` numbers and writes them), as openai-python's ``types/responses`` lays them out.
Only the events this server sends are here: ``response.created`` / ``in_progress`` / ``completed`` (``status``
``incomplete`` when ``max_output_tokens`` was reached), ``output_item.added`` / ``done``, ``content_part.added`` /
``done``, ``output_text.delta`` / ``done``, ``function_call_arguments.done`` and ``error`` (the thinking and a call's
arguments are sent whole, in their items, never as deltas).

Slotted dataclasses, like ``openai_types`` (whose ``PromptTokensDetails`` is the usage's ``input_tokens_details``,
with our cache miss fields). They write the bytes this surface always wrote (pinned by
``tests/chat/server/test_wire_bodies.py``): a stream's events by :func:`dumps`, the standard library's ``json`` with
``", "`` and ``": "`` separators and non-ASCII kept; a whole response by :func:`compact`, as FastAPI wrote the dict it
replaces. A streamed text delta is its sequence number and text written between pieces cut once per stream from an
encoded :class:`OutputTextDelta` (:meth:`EventWriter.text_delta`), which costs less than a dict encoded whole.
"""

from __future__ import annotations

import json
from dataclasses import field
from json.encoder import encode_basestring  # what json.dumps(ensure_ascii=False) writes for a str
from typing import Any, ClassVar, Literal

from chat.server.surfaces.openai_types import PromptTokensDetails, Wire, _as_dict

Status = Literal["in_progress", "completed"]


def dumps(obj: Any) -> str:
    """``obj`` as a stream event's JSON (None fields a class lists in ``OMIT_NONE`` left out)."""
    return json.dumps(obj, default=_as_dict, ensure_ascii=False)


def compact(obj: Any) -> bytes:
    """``obj`` as a whole response's JSON: compact, non-ASCII kept, as FastAPI's ``JSONResponse`` writes it."""
    return json.dumps(obj, default=_as_dict, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def plain(obj: Any) -> Any:
    """``obj`` as plain JSON values (dicts, lists...): what a stored response keeps and ``GET`` sends back."""
    return json.loads(compact(obj))


# --- usage -----------------------------------------------------------------------------------------------------


@Wire
class OutputTokensDetails:
    reasoning_tokens: int = 0  # not counted apart: always 0


@Wire
class ResponseUsage:
    input_tokens: int
    input_tokens_details: PromptTokensDetails  # cached_tokens, and our cache_miss_reason / cache_miss_at
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


# --- output items ----------------------------------------------------------------------------------------------


@Wire
class OutputText:
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = field(default_factory=list)
    logprobs: list[Any] | None = field(default_factory=list)  # None (left out): a part just added, still empty

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("logprobs",)


@Wire
class OutputMessage:
    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


@Wire
class ReasoningText:
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


@Wire
class ReasoningItem:
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = field(default_factory=list)
    content: list[ReasoningText]
    status: Status | None = None  # only while a stream announces it (``output_item.added``), then left out

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("status",)


@Wire
class FunctionCallItem:
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text
    status: Status


OutputItem = OutputMessage | ReasoningItem | FunctionCallItem


# --- the response ----------------------------------------------------------------------------------------------


@Wire
class IncompleteDetails:
    reason: Literal["max_output_tokens"] = "max_output_tokens"


@Wire
class ReasoningConfig:
    effort: None = None
    summary: None = None


@Wire
class TextFormat:
    type: Literal["text"] = "text"


@Wire
class TextConfig:
    """``text`` when the request named none."""

    format: TextFormat = field(default_factory=TextFormat)


@Wire
class Response:
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None  # a failure is an ``error`` event, never a failed response
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)
    store: bool
    temperature: float | None
    text: TextConfig | dict[str, Any]  # the request's, as it sent it
    tool_choice: Any  # the request's, as it sent it ("auto" when it sent none)
    tools: list[dict[str, Any]]  # the request's, as it sent them
    top_p: float | None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None  # None until the response is done
    metadata: dict[str, str]


@Wire
class ResponseDeleted:
    """The answer to ``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


# --- the stream ------------------------------------------------------------------------------------------------


@Wire
class ResponseCreated:
    type: Literal["response.created"] = "response.created"
    sequence_number: int
    response: Response


@Wire
class ResponseInProgress:
    type: Literal["response.in_progress"] = "response.in_progress"
    sequence_number: int
    response: Response


@Wire
class ResponseCompleted:
    """The stream's last event (the response ``completed`` or ``incomplete``)."""

    type: Literal["response.completed"] = "response.completed"
    sequence_number: int
    response: Response


@Wire
class OutputItemAdded:
    type: Literal["response.output_item.added"] = "response.output_item.added"
    sequence_number: int
    output_index: int
    item: OutputItem


@Wire
class OutputItemDone:
    type: Literal["response.output_item.done"] = "response.output_item.done"
    sequence_number: int
    output_index: int
    item: OutputItem


@Wire
class ContentPartAdded:
    type: Literal["response.content_part.added"] = "response.content_part.added"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


@Wire
class ContentPartDone:
    type: Literal["response.content_part.done"] = "response.content_part.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


@Wire
class OutputTextDelta:
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


@Wire
class OutputTextDone:
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


@Wire
class FunctionCallArgumentsDone:
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


@Wire
class ErrorEvent:
    """A stream that failed after it began ends with it."""

    type: Literal["error"] = "error"
    sequence_number: int
    code: str
    message: str


class EventWriter:
    """One stream's events as server-sent events (``event: <type>`` and ``data: <json>``), numbered in the order
    written. The text deltas of the stream's message (``msg_id``, content 0, at :attr:`message_index` of the output)
    are written between pieces
    cut once from an encoded :class:`OutputTextDelta` (the same text :meth:`event` writes for it: see
    :meth:`whole_delta`)."""

    SEQ, TEXT = 987654321, "\ue000"  # stand-ins, cut out of the encoded delta

    def __init__(self, msg_id: str) -> None:
        self.msg_id, self.sequence_number = msg_id, 0
        self.message_at(0)

    def message_at(self, output_index: int) -> None:
        """The message's place in ``output`` (0 unless a reasoning item stands before it), which its deltas say."""
        self.message_index = output_index
        probe = self._write(OutputTextDelta(sequence_number=self.SEQ, item_id=self.msg_id, output_index=output_index,
                                            content_index=0, delta=self.TEXT))  # fmt: skip
        head, rest = probe.split(str(self.SEQ), 1)
        middle, tail = rest.split(encode_basestring(self.TEXT), 1)
        self._head, self._middle, self._tail = head, middle, tail

    def event(self, cls: type, **fields: Any) -> str:
        """The event ``cls(**fields)``, numbered next."""
        number = self.sequence_number
        self.sequence_number += 1
        return self._write(cls(sequence_number=number, **fields))

    def text_delta(self, text: str) -> str:
        """The message's next text delta, numbered next."""
        number = self.sequence_number
        self.sequence_number += 1
        return f"{self._head}{number}{self._middle}{encode_basestring(text)}{self._tail}"

    def whole_delta(self, text: str) -> str:
        """The message's next text delta, encoded whole from its model."""
        index = self.message_index
        return self.event(OutputTextDelta, item_id=self.msg_id, output_index=index, content_index=0, delta=text)

    @staticmethod
    def _write(event: Any) -> str:
        return f"event: {event.type}\ndata: {dumps(event)}\n\n"
