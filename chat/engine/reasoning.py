"""Reasoning (thinking) replies: a model whose chat template thinks writes ``<think> ... </think>`` before its answer
(Qwen3, SmolLM3, DeepSeek-R1 distills). The thinking goes to ``reasoning_content``, the rest to ``content``; a
thinking budget ends the thinking after so many tokens by writing the end marker for the model; structured output
and tool grammars apply to the answer only (:func:`after_thinking`).

    markers = markers_of(chat_template)           # Markers("<think>", "</think>") or None
    reasoning, content = markers.split(text)      # a whole reply
    splitter = ReasoningSplitter(markers)         # a streamed one: push(text) -> (reasoning, content) pieces

The model opens the thinking itself (the template's generation prompt ends before ``<think>``); with the template's
``enable_thinking: false`` (``chat_template_kwargs``) the template closes an empty block in the prompt and the reply
is all answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from chat.engine.constraints import JSON_OPTIONS, GrammarSpec


@dataclass(frozen=True, slots=True)
class Markers:
    start: str = "<think>"
    end: str = "</think>"

    def split(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, content)`` of a whole reply; reasoning None when the reply does not open with ``start``.
        A reply cut inside its thinking is all reasoning."""
        body = text.lstrip()
        if not body.startswith(self.start):
            return None, text
        body = body[len(self.start) :]
        thought, marker, answer = body.partition(self.end)
        return thought.strip("\n"), answer.lstrip("\n") if marker else ""


def markers_of(chat_template: str | None) -> Markers | None:
    """The thinking markers of a template that thinks (it names ``<think>``), else None."""
    return Markers() if chat_template and "<think>" in chat_template else None


class ReasoningSplitter:
    """Streams a reply's text as reasoning and content pieces, holding back text that may still become a marker."""

    def __init__(self, markers: Markers) -> None:
        self.markers = markers
        self._held = ""  # text not yet released
        self._state = "start"  # "start" (before anything but whitespace), "thinking", "after" (its end), "answer"

    def push(self, text: str) -> tuple[str, str]:
        """New text -> (reasoning piece, content piece)."""
        self._held += text
        reasoning, content = "", ""
        while True:
            if self._state == "start":
                stripped = self._held.lstrip()
                if self.markers.start.startswith(stripped):
                    return reasoning, content  # could still open the thinking
                if stripped.startswith(self.markers.start):
                    self._held, self._state = stripped[len(self.markers.start) :].lstrip("\n"), "thinking"
                    continue
                self._state = "answer"
            if self._state == "thinking":
                at = self._held.find(self.markers.end)
                if at >= 0:
                    reasoning += self._held[:at].rstrip("\n")
                    self._held, self._state = self._held[at + len(self.markers.end) :], "after"
                    continue
                partial = _partial_suffix(self._held, self.markers.end)
                before = self._held[: len(self._held) - partial]
                keep = partial + len(before) - len(before.rstrip("\n"))  # newlines may precede the end marker
                reasoning += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep :]
                return reasoning, content
            if self._state == "after":  # newlines between the end marker and the answer are neither
                self._held = self._held.lstrip("\n")
                if not self._held:
                    return reasoning, content
                self._state = "answer"
            content += self._held
            self._held = ""
            return reasoning, content

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held.rstrip("\n"), "") if self._state == "thinking" else ("", held)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that begins ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def after_thinking(markers: Markers, spec: GrammarSpec | None) -> GrammarSpec:
    """A grammar for a thinking reply: free thinking up to the end marker, then ``spec`` (free text when None).

    Raises:
        ValueError: a grammar without a ``start`` rule, or with its own ``answer`` or ``think`` rule.
    """
    head = (  # the thinking, its end marker, the blank lines models write after it, then the answer
        f"start: {json.dumps(markers.start)} think gap answer\n"
        f"think[stop={json.dumps(markers.end)}]: /(?s:.*)/\n"
        'gap: "" | "\\n" | "\\n\\n"\n'
    )
    if spec is None:
        return GrammarSpec("grammar", head + "answer: /(?s:.*)/\n")
    if spec.kind == "json_object":
        return GrammarSpec(
            "grammar", head + f"answer: %json {json.dumps({'type': 'object', 'x-guidance': JSON_OPTIONS})}\n"
        )
    if spec.kind == "json_schema":
        schema = json.loads(spec.source) if spec.source else {}
        schema = (
            {**schema, "x-guidance": {**JSON_OPTIONS, "lenient": not spec.strict}}
            if isinstance(schema, dict)
            else schema
        )
        return GrammarSpec("grammar", head + f"answer: %json {json.dumps(schema, ensure_ascii=False)}\n", spec.strict)
    if spec.kind == "regex":
        return GrammarSpec("grammar", head + f"answer: /{spec.source}/\n")
    if spec.kind == "choice":
        return GrammarSpec(
            "grammar", head + "answer: " + " | ".join(json.dumps(c) for c in json.loads(spec.source)) + "\n"
        )
    text = spec.source
    if "::=" in text:
        import llguidance

        text = llguidance.gbnf_to_lark(text)
    if re.search(r"^(answer|think)\s*[:\[]", text, flags=re.M) or not re.search(r"^start\s*:", text, flags=re.M):
        raise ValueError("this grammar cannot follow thinking (it must have a start rule and no answer or think rule)")
    return GrammarSpec("grammar", head + re.sub(r"^start\s*:", "answer:", text, count=1, flags=re.M), spec.strict)
