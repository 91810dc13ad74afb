"""Recent replies, per namespace (model, dtype, tenant), so a turn whose reuse stopped inside a reply can tell that
the template re-rendered what the model wrote (the ``template_drift`` reason, :data:`chat.engine.turn.MISS_REASONS`).

A reply is remembered as where it began (its prompt's length and a digest of that prompt), the tokens generated, and
its text. :meth:`RecentReplies.drift_at` answers for a prompt whose reuse stopped at ``k``: was ``k`` inside a
remembered reply that the prompt follows up to ``k`` (the same prompt before it, the same tokens from its start to
``k``), and does the conversation hold an assistant message that is that reply (its text, or its end: a template or
client that dropped the thinking; or calls, which templates re-serialize)? An edited message is then not drift.
Bounded: :data:`PER_NAMESPACE` replies per namespace, :data:`NAMESPACES` namespaces, least recently used forgotten.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

PER_NAMESPACE = 64  # replies remembered per namespace
NAMESPACES = 1024  # namespaces remembered


def _digest(tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Reply:
    start: int  # the prompt length: the reply's first token is at this position
    prompt_digest: bytes  # of the prompt it followed
    tokens: tuple[int, ...]  # what the model generated
    text: str  # its text


class RecentReplies:
    """Not thread-safe: the engine's scheduler thread records and asks."""

    def __init__(self, per_namespace: int = PER_NAMESPACE, namespaces: int = NAMESPACES) -> None:
        self._replies: OrderedDict[Hashable, deque[Reply]] = OrderedDict()  # least recently used namespace first
        self._per_namespace = per_namespace
        self._namespaces = namespaces

    def record(self, namespace: Hashable, prompt: Sequence[int], tokens: Sequence[int], text: str) -> None:
        """Remember that the model answered ``prompt`` with ``tokens`` (``text``)."""
        if not tokens:
            return
        replies = self._replies.pop(namespace, None) or deque(maxlen=self._per_namespace)
        replies.append(Reply(len(prompt), _digest(prompt), tuple(tokens), text))
        self._replies[namespace] = replies
        while len(self._replies) > self._namespaces:
            self._replies.popitem(last=False)

    def drift_at(self, namespace: Hashable, prompt: Sequence[int], k: int, messages: Sequence[dict[str, Any]]) -> bool:
        """Whether reuse stopping at ``k`` is the template re-rendering a recent reply (see the module docstring)."""
        for reply in reversed(self._replies.get(namespace, ())):
            if not reply.start <= k < reply.start + len(reply.tokens) or len(prompt) < k:
                continue
            if list(prompt[reply.start : k]) != list(reply.tokens[: k - reply.start]):
                continue
            if _digest(prompt[: reply.start]) == reply.prompt_digest and _holds(messages, reply.text):
                return True
        return False


def _holds(messages: Sequence[dict[str, Any]], text: str) -> bool:
    """Whether an assistant message of ``messages`` is the reply ``text``, as a client or template gives it back."""
    for m in messages:
        if m.get("role") != "assistant":
            continue
        content = m.get("content")
        if isinstance(content, str) and content.strip() and text.strip().endswith(content.strip()):
            return True
        calls = m.get("tool_calls") or ()
        if calls and all(_call_name(c) in text for c in calls):
            return True
    return False


def _call_name(call: Any) -> str:
    if isinstance(call, dict):
        return str(call.get("function", {}).get("name", call.get("name", "")))
    return str(getattr(call, "name", ""))
