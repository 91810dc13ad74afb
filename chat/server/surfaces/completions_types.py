"""OpenAI's legacy completion on the wire (``POST /v1/completions``): the reply (:class:`Completion`), the stream's
chunks (:class:`CompletionChunk`, the last with usage), as openai-python's ``types/completion`` lays them out.

Slotted dataclasses, like ``openai_types`` (whose usage and timings they share). A whole reply is written by
``openai_types.encode`` (compact, as FastAPI wrote it); stream chunks by :func:`dumps`, the standard library's
``json`` as this surface's stream always wrote (``", "`` and ``": "`` separators, non-ASCII escaped), so its bytes
are unchanged (``tests/chat/server/test_wire_bodies.py``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from chat.server.surfaces.openai_types import CompletionUsage, Timings, Wire, _as_dict


def dumps(obj: Any) -> str:
    """``obj`` as this surface's JSON (None fields a class lists in ``OMIT_NONE`` left out)."""
    return json.dumps(obj, default=_as_dict)


@Wire
class CompletionLogprobs:
    tokens: list[str]
    token_logprobs: list[float | None]  # None: a token with nothing before it (an echoed prompt's first)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


@Wire
class CompletionChoice:
    text: str
    index: int
    logprobs: CompletionLogprobs | dict[str, list] | None = None
    finish_reason: Literal["stop", "length"] | None = None


@Wire
class Completion:
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    timings: Timings


@Wire
class CompletionChunk:
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]


@Wire
class FinalCompletionChunk(CompletionChunk):
    """The stream's last chunk: the request's usage (each prompt counted once) and the first reply's timings."""

    usage: CompletionUsage
    timings: Timings


class ChunkTemplate:
    """One stream's text chunks (no finish reason yet): its id, time and model are the same in every chunk, so a
    chunk is its text, index and log-probabilities written between pieces cut once from an encoded
    :class:`CompletionChunk` (the same text :func:`dumps` writes for it whole: see :meth:`whole`)."""

    INDEX, TEXT = 987654321, "\ue000"  # stand-ins, cut out of the encoded chunk

    def __init__(self, cid: str, created: int, model: str) -> None:
        self.id, self.created, self.model = cid, created, model
        probe = self.whole(self.INDEX, self.TEXT)
        head, rest = probe.split(json.dumps(self.TEXT), 1)
        middle, rest = rest.split(str(self.INDEX), 1)
        logprobs, tail = rest.split("null", 1)
        self._head, self._middle, self._logprobs, self._tail = head, middle, logprobs, tail

    def text(self, index: int, text: str, logprobs: CompletionLogprobs | None = None) -> str:
        lp = dumps(logprobs) if logprobs is not None else "null"
        return f"{self._head}{json.dumps(text)}{self._middle}{index}{self._logprobs}{lp}{self._tail}"

    def whole(self, index: int, text: str, logprobs: CompletionLogprobs | None = None) -> str:
        """The chunk encoded whole from its model."""
        choice = CompletionChoice(text=text, index=index, logprobs=logprobs)
        chunk = CompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])
        return f"data: {dumps(chunk)}\n\n"
