"""What the engine needs of a model's vocabulary beyond encode / decode: the table constrained decoding masks against
(an ``llguidance.LLTokenizer``), each token's bytes (for log-probabilities on the wire), and the sampling defaults of
the model's ``generation_config``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GENERATION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # defaults a model may set


class Vocabulary:
    """One tokenizer's token table, built on first use (~0.4 s for 49k tokens) and then shared (thread-safe)."""

    def __init__(self, tokenizer: Any, *, logits_width: int, eos_token_ids: Iterable[int]) -> None:
        self._tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer, or itself
        self.logits_width = logits_width  # tokens the model scores (the embedding may be wider than the tokenizer)
        self._eos = sorted(eos_token_ids)  # what ends a reply: a grammar lets these through once it may end
        self._table: Any = None  # llguidance.LLTokenizer

    def table(self) -> Any:
        """The ``llguidance.LLTokenizer`` over every logit (ids past the tokenizer's own are never allowed)."""
        if self._table is None:
            import llguidance.hf

            self._table = llguidance.hf.from_tokenizer(
                self._tokenizer, n_vocab=self.logits_width, eos_token=self._eos or None
            )
        return self._table

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token as the model writes it (a special token's own text; ``<[id]>``, llguidance's
        placeholder, for an id past the tokenizer)."""
        return bytes(self.table().decode_bytes([token_id]))


def generation_defaults(generation_config: Any) -> Mapping[str, float | int]:
    """The sampling settings a model's ``generation_config`` sets (of :data:`GENERATION_FIELDS`); greedy models
    (``do_sample`` false with a temperature set) are not forced greedy: as vLLM, only the values are taken."""
    if generation_config is None:
        return {}
    explicit = generation_config.to_diff_dict() if hasattr(generation_config, "to_diff_dict") else {}
    out: dict[str, float | int] = {}
    for name in GENERATION_FIELDS:
        value = explicit.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = value
    return out
