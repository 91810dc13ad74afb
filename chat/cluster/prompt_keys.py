"""The routing key of a turn: chained digests of its rendered prompt, one per full block of tokens.

A conversation's next turn renders to its previous prompt, the reply, and the new message: a token sequence that
starts with the previous one. Digest ``i`` covers blocks ``0..i`` (each digest chains the previous one), so a longer
conversation shares its leading digests with every shorter form of itself, and the longest digest a replica was
seen with says how much of the prompt that replica last served. Only full blocks count: a prompt shorter than one
block has no key and is routed by load alone.

The chain starts from the tenant's cache salt, so tenants never share routing entries (as they never share cache
entries). Media parts enter the rendering as a marker naming the kind and the SHA-256 of the bytes: the key never
decodes media, and the same image at the same place gives the same key.

A conversation's **opening** (its messages up to and including the first user message) renders to the same tokens
in every turn of it: the digest of the block where the opening ends (the first block, if the opening is shorter) is
the conversation's placement key (``chat.cluster.routing``), the same for all its turns, and different for
conversations that share only a system prompt.

The rendering does not have to equal the engine's to the token (the engine renders media as placeholder runs); it
only has to be a deterministic function of the conversation that extends with it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Render = Callable[[list[dict[str, str]]], list[int]]  # text-only messages -> token ids, with the generation prompt


def routing_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Engine messages (string content, or text dicts and :class:`modalities.parts.MediaInput`) as text-only ones."""
    out = []
    for message in messages:
        content = message.get("content")
        if content is None or isinstance(content, str):
            text = content or ""
        else:
            text = "".join(_part_text(part) for part in content)
        out.append({"role": str(message.get("role")), "content": text})
    return out


def _part_text(part: Any) -> str:
    if isinstance(part, Mapping):
        return str(part.get("text", ""))
    return f"<{part.kind}:{part.digest[:32]}>"  # a MediaInput: the digest of its bytes, computed once on the wire


def block_digests(tokens: Sequence[int], salt: str, block_tokens: int) -> tuple[int, ...]:
    """One 64-bit digest per full block of ``block_tokens`` tokens; digest ``i`` depends on blocks ``0..i``."""
    state = hashlib.blake2b(b"turncache-route\0" + salt.encode(), digest_size=8).digest()
    out = []
    for end in range(block_tokens, len(tokens) + 1, block_tokens):
        block = array("Q", tokens[end - block_tokens : end]).tobytes()
        state = hashlib.blake2b(state + block, digest_size=8).digest()
        out.append(int.from_bytes(state, "big"))
    return tuple(out)


class PromptKeyer:
    """Routing keys of turns for one model: ``render`` is its chat template (``ChatRenderer.render``: the ingress's
    ``chat.models.load_renderer``, which renders text as the replicas' ``ModelAdapter.render`` does)."""

    def __init__(self, render: Render, block_tokens: int) -> None:
        self.render = render  # text-only messages -> token ids
        self.block_tokens = block_tokens  # tokens per digest block

    def digests(self, messages: Sequence[Mapping[str, Any]], salt: str) -> tuple[int, ...]:
        """The turn's block digests; ``()`` when the messages cannot be rendered (the replica will refuse the turn
        with the engine's own typed error, and routing by load is as good as any)."""
        return self.keys(messages, salt)[0]

    def keys(self, messages: Sequence[Mapping[str, Any]], salt: str) -> tuple[tuple[int, ...], int | None]:
        """The turn's block digests and its conversation's opening digest (None: the prompt has no full block, or
        cannot be rendered)."""
        text = routing_messages(messages)
        try:
            tokens = self.render(text)
            first_user = next((i for i, m in enumerate(text) if m["role"] == "user"), len(text) - 1)
            opening = len(self.render(text[: first_user + 1])) if first_user + 1 < len(text) else len(tokens)
        except Exception:  # the engine reports what is wrong with the messages; routing only needs a key
            return (), None
        digests = block_digests(tokens, salt, self.block_tokens)
        if not digests:
            return (), None
        return digests, digests[min(max(opening // self.block_tokens, 1), len(digests)) - 1]
