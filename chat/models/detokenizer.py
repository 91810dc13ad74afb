"""Incremental detokenization: text deltas from a stream of token ids, safe across split UTF-8 sequences.

Works for any tokenizer given its ``decode``. The text of the tokens since the last emitted delta is decoded
together with a few tokens before them (so that tokenizers which drop a leading space at the start of a decode,
like SentencePiece, still give the right text), and a delta is held back while it ends in U+FFFD: that is what a
byte-level decode gives for an incomplete multi-byte character. :meth:`flush` releases whatever is held at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed tokens with :meth:`push`; call :meth:`flush` once at the end. Not thread-safe."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode  # token ids -> text (special tokens skipped, no space clean-up)
        self._tokens: list[int] = []  # every token pushed
        self._prefix = 0  # start of the context window decoded with the pending tokens
        self._read = 0  # tokens before this index have been emitted

    def push(self, token_id: int) -> str:
        """Feed one token; return the new text it completes ("" while a character is incomplete)."""
        self._tokens.append(int(token_id))
        before = self._decode(self._tokens[self._prefix : self._read])
        after = self._decode(self._tokens[self._prefix :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._tokens)
        return after[len(before) :]

    def flush(self) -> str:
        """Text still held back (an incomplete character at the very end comes out as U+FFFD)."""
        if self._read == len(self._tokens):
            return ""
        before = self._decode(self._tokens[self._prefix : self._read])
        after = self._decode(self._tokens[self._prefix :])
        self._prefix = self._read = len(self._tokens)
        return after[len(before) :] if after.startswith(before) else after
