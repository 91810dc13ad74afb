"""The model adapters: a loaded causal LM and its tokenizer behind the interface the turn engine needs
(``chat.engine.runtime.ModelRuntime``). No transformers type crosses this boundary: token ids, float32 logits and
:mod:`cache` layer states go in and out.

One generation::

    run = model.new_run(lease)                  # empty, or the lease's state at lease.length (nothing copied)
    logits = model.forward(run, prompt[n:])     # [q, vocab] float32; run.length grows by q
    model.snapshot(run)                         # at each boundary where a cache entry will be stored
    cache.insert(ns, tokens, model.export(run)) # views of the run's buffers; recurrent snapshots
    model.close_run(run)                        # drop the run's references

:class:`ModelAdapter` holds what every runtime shares (the tokenizer and chat template side, the checks of a feed);
two kinds of forward stand behind it:

- :class:`chat.models.decoder.runtime.DecoderAdapter`: turncache's own decoder forward
  (:mod:`chat.models.decoder.model`), for the families whose every layer is attention (Llama/SmolLM, Qwen2, Qwen3,
  Mistral, Gemma 2/3 text): every feed of a step in one packed forward.
- :class:`chat.models.hf.runtime.TransformersAdapter`: transformers' own forward, patched
  (:mod:`chat.models.hf.fast_paths`, :mod:`chat.models.hf.ragged`, :mod:`chat.models.hf.run_cache`), for what the own
  decoder does not cover yet: hybrid recurrent models (their mixers' scans and states are transformers' code) and
  multimodal models (:class:`chat.models.hf.multimodal.MultimodalAdapter`: their encoders, 3-D positions and deepstack
  features are). A model of the own decoder's families imports none of those modules.

Speculative decoding feeds draft tokens and forgets the rejected ones with ``model.rewind(run, n)`` (models without
recurrent layers). Positions are always explicit (``[length, length + q)``). Not thread-safe: one thread drives a
model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from chat.engine.reasoning import markers_of
from chat.engine.runtime import Feed
from chat.engine.tool_calls import format_of
from chat.models.chat_template import template_of
from chat.models.detokenizer import IncrementalDetokenizer
from chat.models.errors import InvalidSettingError, RunStateError
from chat.models.prompt_tokens import PromptEncoder
from chat.models.renderer import render_chat
from chat.models.vocabulary import Vocabulary, generation_defaults

DEFAULT_ROTATING_MARGIN = 64  # rows kept beyond W - 1 in sliding layers: rewinds of up to this many tokens


@dataclass(eq=False)
class RunState:
    """One generation's live state. Create with :meth:`ModelAdapter.new_run`; close with ``close_run``."""

    owner: int  # id() of the adapter that made it
    state: Any = field(repr=False)  # the model state the forward reads and appends to (private to chat.models: a
    # hf_cache.RunCache for TransformersAdapter, a list of kv_rows.AttentionRows per layer for DecoderAdapter); None
    # once closed
    length: int  # tokens absorbed
    inherited: dict[int, Mapping[int, tuple[torch.Tensor, ...]]] = field(default_factory=dict)  # slot ->
    # snapshots at lengths <= the lease's length, from the cache entry (by reference)
    snapshots: dict[int, dict[int, tuple[torch.Tensor, ...]]] = field(default_factory=dict)  # slot -> length ->
    # recurrent states recorded by this run
    broken: bool = False  # a forward failed half-way: the state is inconsistent
    media: Any = None  # multimodal adapters: the prompt's media items and position plan (chat.models.hf.multimodal)
    lora: Any = None  # DecoderAdapter: the chat.models.decoder.lora.LoraAdapter the run computes under (None: the base)


class ModelAdapter:
    """What every runtime of :mod:`chat.models` shares: the tokenizer and chat template side, feed checks, and
    :meth:`forward` over :meth:`forward_batch`. Subclasses own the runs. Build one with
    :func:`chat.models.load_model`."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        name: str,
        fingerprint: str,
        kv_dtype: str,
        context_window: int,
        eos_token_ids: set[int],
        weights: str,
        vocab_size: int,
        device: torch.device,
        generation_config: Any,
    ) -> None:
        self._tokenizer = tokenizer  # its tokenizer, with its chat template (or none: a base model)
        self.name = name  # what /v1/models lists
        self.chats = template_of(tokenizer) is not None  # it has a chat template: chat turns can be rendered (else
        # a base model: completions only, chat turns answer NoChatTemplateError)
        self.fingerprint = fingerprint  # weights + config + tokenizer: the cache namespace's model id
        self.kv_dtype = kv_dtype  # what attention K/V are stored in (the cache namespace's dtype)
        self.context_window = context_window  # most tokens a sequence may hold
        self.eos_token_ids = frozenset(eos_token_ids)  # tokens that end a reply
        self.modalities: frozenset[str] = frozenset()  # media kinds taken (multimodal adapters set theirs)
        self.weights = weights  # format of the linear layers' weights (chat.models.kernels.matrices.WEIGHT_FORMATS)
        self.vocab_size = vocab_size  # logits per token
        self.device = device  # where the model computes
        self.generation_defaults = generation_defaults(generation_config)  # sampling settings the model's
        # generation_config sets (for request fields left out)
        self._vocabulary = Vocabulary(tokenizer, logits_width=self.vocab_size, eos_token_ids=self.eos_token_ids)
        self.prompt_encoder = PromptEncoder(tokenizer)  # a prompt's ids, reusing those of earlier renders per salt
        self.reasoning = markers_of(getattr(tokenizer, "chat_template", None))  # thinking markers, if it thinks
        self.tool_format = format_of(getattr(tokenizer, "chat_template", None))  # how it calls tools
        # (chat.engine.tool_calls.FORMATS); "generic" when its template takes no tools
        self.has_recurrent_state = False  # some layer is recurrent: snapshot boundaries matter
        self.whole_media_spans = False  # text models: no media (multimodal adapters may say otherwise)

    @property
    def dtype(self) -> str:
        """:attr:`kv_dtype` under the name the runtime protocol (``chat.engine.runtime.ModelRuntime``) gives it:
        what the cache namespace is keyed by."""
        return self.kv_dtype

    # ================================================================ text

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` (``{"role", "content"}`` with string content) through the chat template (what
        :func:`chat.models.renderer.render_chat` gives, as a weightless renderer of this model does).

        Raises:
            InvalidSettingError: a message is not a role/content pair of strings (``field`` names which).
            NoChatTemplateError, ChatTemplateError: no chat template (a base model), or it raised.
        """
        return render_chat(self._tokenizer, messages, add_generation_prompt, model=self.name)

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        salt: str = "",
    ) -> TextPrompt:
        """The prompt of ``messages`` (string contents) with the generation prompt: a text model has no media.
        ``tools`` go to a template that renders them (``tool_format`` is not "generic"); ``template_kwargs`` to the
        template as variables (``enable_thinking``). The ids are what a full encode of the rendered text gives,
        reusing those of earlier renders with the same ``salt`` (a tenant's) that the text begins with
        (:mod:`chat.models.prompt_tokens`).

        Raises:
            InvalidSettingError: a message is not a role/content pair of strings.
            NoChatTemplateError, ChatTemplateError: no chat template (a base model), or it raised.
        """

        def encode(text: str) -> list[int]:
            return self.prompt_encoder.encode(text, salt)

        ids = render_chat(self._tokenizer, messages, True, tools, template_kwargs, encode, model=self.name)
        return TextPrompt(tuple(ids))

    def encode(self, text: str) -> list[int]:
        """Token ids of plain ``text`` (no chat template, no special tokens added)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a completions prompt: ``text`` with the special tokens its tokenizer puts around any text
        (Gemma's ``<bos>``, without which a base Gemma's logits drift; none for ChatML tokenizers such as
        smollm2's), as vLLM's and llama.cpp's servers tokenize a prompt string."""
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens left out."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def constraint_tokenizer(self) -> Any:
        """The token table grammars are compiled against (``llguidance.LLTokenizer``; built at the first call)."""
        return self._vocabulary.table()

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes (for log-probabilities on the wire)."""
        return self._vocabulary.token_bytes(token_id)

    def detokenizer(self) -> IncrementalDetokenizer:
        """A fresh incremental detokenizer for one reply."""
        return IncrementalDetokenizer(self.decode)

    def forward(self, run: RunState, token_ids: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Logits ``[q, vocab]`` (float32) for ``token_ids`` appended to ``run`` (``[1, vocab]`` with
        ``last_only``, which skips the output projection of the other tokens); advances ``run.length`` by q.

        Raises:
            RunStateError: the run is closed, broken, from another model, or would outgrow the context window.
            InvalidSettingError: a token id outside the vocabulary.
        """
        (outcome,) = self.forward_batch([Feed(run, token_ids, 1 if last_only else len(token_ids))])
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    def forward_batch(
        self, feeds: Sequence[Any], interrupt: Callable[[], bool] | None = None
    ) -> list[torch.Tensor | Exception | None]:
        raise NotImplementedError

    def extras(self, run: RunState) -> tuple[tuple[int, Any], ...]:
        """Position state stored with an entry: none for text models (positions are token counts)."""
        self._live(run)
        return ()

    def _check_feed(self, feed: Any) -> tuple[RunState, list[int]]:
        """The feed's run and its token ids, once both are known to fit."""
        run = feed.run
        self._live(run)
        token_ids = [int(t) for t in feed.tokens]
        q = len(token_ids)
        if q == 0:
            raise InvalidSettingError("token_ids", "at least one token is needed")
        if not isinstance(feed.logits, int) or not 0 <= feed.logits <= q:
            raise InvalidSettingError("logits", f"must be an integer in [0, {q}], got {feed.logits!r}")
        if run.length + q > self.context_window:
            raise RunStateError(f"{run.length} + {q} tokens exceed the context window of {self.context_window} tokens")
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            raise InvalidSettingError("token_ids", f"token ids must be in [0, {self.vocab_size})")
        return run, token_ids

    def _live(self, run: RunState) -> Any:
        if not isinstance(run, RunState) or run.owner != id(self):
            raise RunStateError(f"this run was not made by the adapter of {self.name}")
        if run.state is None:
            raise RunStateError("this run is closed")
        if run.broken:
            raise RunStateError("a forward failed on this run; its state is inconsistent, start a new one")
        return run.state


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """A rendered text prompt (the ``RenderedPrompt`` of ``chat.engine.runtime``)."""

    tokens: tuple[int, ...]  # token ids through the chat template, generation prompt included
    spans: tuple[()] = ()  # no media
