"""Draft tokens for speculative decoding by prompt lookup: guess that the sequence goes on the way it went on after
the latest earlier occurrence of its last few tokens.

Replies often repeat what is already in the conversation (names, phrases, code, their own earlier sentences), and a
forward of a few tokens costs little more than a forward of one on this CPU (decoding is bound by reading weights).
The engine feeds ``[next token, *draft]`` in one forward, keeps the draft tokens up to the first one that greedy
decoding would not have chosen plus the model's own choice after them, and rewinds the run over the rest: the reply
is the greedy reply (up to float rounding between a one-row and a multi-row forward), only faster when drafts hit::

    lookup = PromptLookup(prompt_tokens)
    lookup.extend([token])             # every token fed or sampled, in order
    draft = lookup.draft(4)            # [] when the tail was never seen before

How many tokens to draft adapts to how well drafts do (:class:`DraftLength`): replies that do not repeat their
context pay for at most one draft token now and then.

No model is needed and nothing here depends on torch.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_NGRAM = 3  # longest tail matched; shorter tails are tried when it was never seen


class DraftLength:
    """How many tokens to draft next: up by 2 after a draft was wholly accepted, down by 1 after one was wholly
    rejected, between 1 and ``most``; a one-token draft needs a tail match of 2 tokens (1-token matches rarely
    predict)."""

    def __init__(self, most: int) -> None:
        self.most = most  # the cap
        self.now = most  # tokens to draft next

    @property
    def min_ngram(self) -> int:
        return 2 if self.now <= 1 else 1

    def update(self, drafted: int, accepted: int) -> None:
        if drafted and accepted == drafted:
            self.now = min(self.most, self.now + 2)
        elif drafted and accepted == 0:
            self.now = max(1, self.now - 1)


class PromptLookup:
    """An index of every n-gram (n <= :data:`MAX_NGRAM`) of a growing token sequence. Not thread-safe."""

    def __init__(self, tokens: Iterable[int] = (), max_ngram: int = MAX_NGRAM) -> None:
        self.max_ngram = max_ngram  # longest tail matched
        self.tokens: list[int] = []  # the sequence so far
        self._after: dict[tuple[int, ...], int] = {}  # n-gram -> index just after its latest occurrence that is not
        # the tail (so that a token follows it)
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the sequence."""
        seq = self.tokens
        for token in tokens:
            end = len(seq)  # n-grams ending here now have a token after them
            for n in range(1, min(self.max_ngram, end) + 1):
                self._after[tuple(seq[end - n : end])] = end
            seq.append(int(token))

    def draft(self, k: int, min_ngram: int = 1) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest tail (of ``min_ngram`` to
        ``max_ngram`` tokens) seen before; ``[]`` if none was."""
        seq = self.tokens
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(seq)), max(min_ngram, 1) - 1, -1):
            start = self._after.get(tuple(seq[len(seq) - n :]))
            if start is not None:
                return seq[start : start + k]
        return []
