"""What the engine needs from a model adapter. ``chat.models`` provides the real one; tests provide fakes.

The engine knows token ids and cache layer states, never transformers types.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from cache import LayerState, Lease


class Run(Protocol):
    """One generation's live model state."""

    @property
    def length(self) -> int:
        """Tokens the state has absorbed."""
        ...


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str:
        """Feed one token; return the text it completes (may be "" while a UTF-8 sequence is incomplete)."""
        ...

    def flush(self) -> str:
        """Text still held back at the end of the generation."""
        ...


class ModelRuntime(Protocol):
    name: str  # what /v1/models lists
    fingerprint: str  # identity of weights + config + tokenizer: the cache namespace's model id
    dtype: str  # "float32" | "bfloat16"
    context_window: int  # most tokens a sequence may hold
    eos_token_ids: set[int]  # tokens that end a reply
    has_recurrent_state: bool  # True when some layer is recurrent (then snapshot boundaries matter)

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]: ...

    def detokenizer(self) -> Detokenizer: ...

    def new_run(self, lease: Lease | None = None) -> Run: ...

    def forward(self, run: Run, token_ids: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Logits ``[len(token_ids), vocab]`` (float32) for ``token_ids`` appended to ``run``, or ``[1, vocab]`` for
        the last token only with ``last_only`` (skips the output projection of the others); advances ``run``."""
        ...

    def snapshot(self, run: Run) -> None:
        """Record the recurrent state at ``run.length`` so that :meth:`export` includes it."""
        ...

    def export(self, run: Run) -> list[LayerState]:
        """The run's state at ``run.length`` as cache layer states (no copy of attention K/V)."""
        ...

    def close_run(self, run: Run) -> None:
        """The run is finished; buffers it owns may be handed on."""
        ...

    # Optional: a runtime with ``can_rewind = True`` and ``rewind(run, n)`` (forget the last ``n`` tokens the run
    # absorbed since it was restored or last exported) gets speculative greedy decoding (chat.engine.drafts).


def iter_tokens(tokens: Sequence[int], chunk: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(tokens), chunk):
        yield tokens[start : start + chunk]
