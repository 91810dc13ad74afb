"""What the engine needs from a model: the :class:`ModelRuntime` protocol. ``chat.models`` provides the real one
(text and multimodal adapters alike); tests provide fakes. Its part that needs no weights, :class:`ChatRenderer`
(name, media kinds, chat template), is all a cluster's ingress holds (``chat.models.load_renderer``).

The engine knows token ids, media spans and cache layer states, never transformers types. One turn uses a runtime
like this (each step of the scheduler gathers the feeds of every active turn into one ``forward_batch``)::

    prompt = runtime.render_prompt(messages)                  # tokens (+ media spans); may raise MediaError
    run = runtime.new_run(lease, prompt)                      # empty, or the lease's state
    [logits] = runtime.forward_batch([Feed(run, chunk, 1)])   # [1, vocab] for the chunk's last token
    runtime.snapshot(run)                                     # recurrent models, where entries will be stored
    cache.insert(ns, tokens, runtime.export(run), media=prompt.spans, extras=runtime.extras(run))
    runtime.rewind(run, n)                                    # forget rejected draft tokens (can_rewind only)
    runtime.close_run(run)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from cache import LayerState, Lease, MediaSpan


class StepInterrupted(Exception):
    """A ``forward_batch`` stopped midway because its ``interrupt`` said so: no run advanced, nothing was computed
    for any feed (each run is exactly as before the call)."""


class Run(Protocol):
    """One generation's live model state."""

    @property
    def length(self) -> int:
        """Tokens the state has absorbed."""
        ...


@dataclass(frozen=True, slots=True)
class Feed:
    """Tokens to append to a run in the next forward, and how many of their last positions need logits."""

    run: Any  # the Run the tokens extend
    tokens: Sequence[int]  # token ids, at least one
    logits: int  # logits wanted for the last `logits` tokens: 0 (a prefill chunk mid-prompt) .. len(tokens)


class RenderedPrompt(Protocol):
    """A conversation rendered for the model."""

    @property
    def tokens(self) -> Sequence[int]:
        """The prompt's token ids (media placeholders expanded to each item's token count)."""
        ...

    @property
    def spans(self) -> Sequence[MediaSpan]:
        """Where each media item lies in ``tokens``, with its content hash (empty for text)."""
        ...


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str:
        """Feed one token; return the text it completes (may be "" while a UTF-8 sequence is incomplete)."""
        ...

    def flush(self) -> str:
        """Text still held back at the end of the generation."""
        ...


class ChatRenderer(Protocol):
    """A model's name, media kinds and chat template: what the server checks wire messages with (``engine_messages``)
    and a cluster's ingress makes routing keys with. A :class:`ModelRuntime` is one."""

    name: str  # what /v1/models lists
    modalities: frozenset[str]  # media kinds the model takes ("image", "audio", "video"); empty for text
    chats: bool  # it has a chat template; False: a base model (completions only: render raises NoChatTemplateError;
    # a runtime without the attribute is taken to chat)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of text-only ``messages`` (used to find where the system prompt ends, and for routing keys)."""
        ...


class ModelRuntime(ChatRenderer, Protocol):
    """A loaded model (``name``, ``modalities`` and ``render`` come from :class:`ChatRenderer`)."""

    fingerprint: str  # identity of weights (and their format) + config + tokenizer: the cache namespace's model id
    dtype: str  # what the attention K/V are stored in: "float32" | "float16" | "bfloat16" (part of the namespace)
    weights: str  # format of the linear layers' weights: "float32" | "bfloat16" | "int8"
    context_window: int  # most tokens a sequence may hold
    eos_token_ids: frozenset[int] | set[int]  # tokens that end a reply
    has_recurrent_state: bool  # some layer is recurrent: snapshots only where taken, prefill split at boundaries
    can_rewind: bool  # rewind() works (no recurrent layers): greedy replies may decode speculatively
    whole_media_spans: bool  # a media item's tokens attend to each other both ways: a prefill chunk never cuts one

    def render_prompt(self, messages: Sequence[Mapping[str, Any]]) -> RenderedPrompt:
        """The prompt of ``messages`` (text, or text and ``modalities.parts.MediaInput`` s). A runtime with a
        ``prompt_encoder`` (``chat.models.prompt_tokens``) also takes ``salt=`` (the turn's tenant salt): it may
        reuse the ids of that tenant's earlier renders, and gives the ids a full render would.

        Raises:
            modalities.errors.MediaError: a media item is corrupt, over a limit, or of a kind the model does not take.
        """
        ...

    def detokenizer(self) -> Detokenizer: ...

    def new_run(self, lease: Lease | None = None, prompt: RenderedPrompt | None = None) -> Run:
        """A run holding ``lease``'s state (or empty), ready to absorb the rest of ``prompt``. A runtime with LoRA
        adapters (``adapters``: ``chat.models.decoder.lora.AdapterBank``) also takes ``adapter=`` (the turn's
        :attr:`~chat.engine.events.TurnRequest.adapter`): the run computes under it, and the lease comes from its
        namespace."""
        ...

    def forward_batch(
        self, feeds: Sequence[Feed], interrupt: Callable[[], bool] | None = None
    ) -> list[torch.Tensor | Exception | None]:
        """Run every feed; per feed, its logits ``[feed.logits, vocab]`` (float32; None for 0) or the error that
        feed caused. A failing feed never changes another feed's result; its run may be left unusable.

        ``interrupt``: a runtime that can stop a forward midway (between layers) calls it there and, when it returns
        True, leaves every run as it was and raises :class:`StepInterrupted`; one that cannot ignores it.
        """
        ...

    def rewind(self, run: Run, n: int) -> None:
        """Forget the last ``n`` tokens absorbed since the run was restored or last exported (``can_rewind`` only)."""
        ...

    def snapshot(self, run: Run) -> None:
        """Record the recurrent state at ``run.length`` so that :meth:`export` includes it (no-op without any)."""
        ...

    def export(self, run: Run) -> list[LayerState]:
        """The run's state at ``run.length`` as cache layer states (no copy of attention K/V)."""
        ...

    def extras(self, run: Run) -> Sequence[tuple[int, Any]]:
        """Position state to store with an entry at ``run.length`` (e.g. mRoPE offsets); () for text models."""
        ...

    def close_run(self, run: Run) -> None:
        """The run is finished; buffers it owns may be handed on."""
        ...
