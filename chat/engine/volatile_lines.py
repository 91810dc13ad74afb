"""Volatile client lines: lines a client puts in its prompts that change per request (or per conversation) and mean
nothing to a local model, dropped from the rendered prompt so that they do not split the prefix cache.

The first one is Claude Code's billing line, the first block of its system prompt::

    x-anthropic-billing-header: cc_version=2.1.197.c8e; cc_entrypoint=sdk-cli;

whose version's last three hex characters change with each conversation's first prompt. It stands before everything
else, so without this two Claude Code sessions share no cached prefix beyond a dozen tokens. The pattern matches
the line's shape (a ``key=value;`` list after the header name), not its values.

A pattern matches from the start of a line (Python ``re``); what it matches is dropped with the spaces and the one
line break after it. Write patterns that match a whole line (the default does). Only the rendered prompt changes: the
messages a session stores, and what a client is sent back, are the client's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

CLAUDE_CODE_BILLING = r"x-anthropic-billing-header:(?:[ \t]*[A-Za-z0-9_.-]+=[^;\r\n]*;)+"
DEFAULT_PATTERNS: tuple[str, ...] = (CLAUDE_CODE_BILLING,)
NEARBY_TOKENS = 256  # tokens decoded after a divergence point to read the rest of its line


class VolatileLines:
    """Compiled patterns, and whether lines they match are dropped (``drop``) or only recognised (to name a cache
    miss they caused: ``volatile_line``)."""

    def __init__(self, patterns: Sequence[str] = DEFAULT_PATTERNS, *, drop: bool = True) -> None:
        """Raises:
        ValueError: a pattern is not a valid regular expression (the message names it)."""
        self.patterns = tuple(patterns)
        self.drop = drop  # False: `--keep-volatile-lines`
        compiled = []
        for pattern in self.patterns:
            try:
                compiled.append(re.compile(rf"^(?:{pattern})[ \t]*(?:\r?\n)?", re.MULTILINE))
            except re.error as exc:
                raise ValueError(f"volatile line pattern {pattern!r}: {exc}") from exc
        self._lines = tuple(compiled)
        self._any = re.compile("|".join(f"(?:{p.pattern})" for p in compiled), re.MULTILINE) if compiled else None

    def strip_text(self, text: str) -> str:
        """``text`` without the volatile lines (whatever ``drop`` says)."""
        if self._any is None or not self._any.search(text):
            return text
        for line in self._lines:
            text = line.sub("", text)
        return text

    def present(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether some message's text holds a volatile line."""
        return self._any is not None and any(self._any.search(text) for text in _texts(messages))

    def prompt_messages(self, messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """The messages to render: ``messages`` themselves when nothing is dropped, else copies of those whose text
        held a volatile line, without it."""
        if not self.drop or not self.present(messages):
            return messages
        return [_stripped(m, self.strip_text) for m in messages]

    def line_at(self, text_before: str, text_after: str) -> bool:
        """Whether the line that holds the point between ``text_before`` and ``text_after`` is a volatile one."""
        if self._any is None:
            return False
        start = text_before.rfind("\n") + 1
        end = text_after.find("\n")
        line = text_before[start:] + (text_after if end < 0 else text_after[:end])
        return any(p.match(line) for p in self._lines)


def _texts(messages: Sequence[Mapping[str, Any]]):
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, Sequence):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    yield part["text"]


def _stripped(message: Mapping[str, Any], strip) -> Mapping[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        new = strip(content)
        return message if new == content else {**message, "content": new}
    if isinstance(content, Sequence) and not isinstance(content, str):
        parts = [
            {**part, "text": strip(part["text"])}
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
        return {**message, "content": parts}
    return message
