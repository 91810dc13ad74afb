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

- :class:`chat.models.decoder_runtime.DecoderAdapter`: turncache's own decoder forward
  (:mod:`chat.models.decoder`), for the families whose every layer is attention (Llama/SmolLM, Qwen2, Qwen3,
  Mistral, Gemma 2/3 text): every feed of a step in one packed forward.
- :class:`TransformersAdapter`: transformers' own forward, patched (:mod:`chat.models.fast_paths`,
  :mod:`chat.models.ragged`, :mod:`chat.models.hf_cache`), for what the own decoder does not cover yet: hybrid
  recurrent models (their mixers' scans and states are transformers' code) and multimodal models
  (:class:`chat.models.multimodal.MultimodalAdapter`: their encoders, 3-D positions and deepstack features are).

Speculative decoding feeds draft tokens and forgets the rejected ones with ``model.rewind(run, n)`` (models without
recurrent layers). Positions are always explicit (``[length, length + q)``). Not thread-safe: one thread drives a
model.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cache import LayerState, Lease, NormalKV, RecurrentSnapshot, RecurrentState, RotatingKV, Stateless
from chat.engine.reasoning import markers_of
from chat.engine.runtime import Feed
from chat.engine.tool_calls import format_of
from chat.models import ragged
from chat.models.detokenizer import IncrementalDetokenizer
from chat.models.errors import InvalidSettingError, RunStateError
from chat.models.fast_paths import install
from chat.models.hf_cache import CacheLayout, RunCache
from chat.models.renderer import render_chat
from chat.models.smoothing import CALIBRATION_TEXT
from chat.models.vocabulary import Vocabulary, generation_defaults

_log = logging.getLogger(__name__)
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
    media: Any = None  # multimodal adapters: the prompt's media items and position plan (chat.models.multimodal)


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
        self._tokenizer = tokenizer  # its tokenizer, with a chat template
        self.name = name  # what /v1/models lists
        self.fingerprint = fingerprint  # weights + config + tokenizer: the cache namespace's model id
        self.kv_dtype = kv_dtype  # what attention K/V are stored in (the cache namespace's dtype)
        self.context_window = context_window  # most tokens a sequence may hold
        self.eos_token_ids = frozenset(eos_token_ids)  # tokens that end a reply
        self.modalities: frozenset[str] = frozenset()  # media kinds taken (multimodal adapters set theirs)
        self.weights = weights  # format of the linear layers' weights (chat.models.matrices.WEIGHT_FORMATS)
        self.vocab_size = vocab_size  # logits per token
        self.device = device  # where the model computes
        self.generation_defaults = generation_defaults(generation_config)  # sampling settings the model's
        # generation_config sets (for request fields left out)
        self._vocabulary = Vocabulary(tokenizer, logits_width=self.vocab_size, eos_token_ids=self.eos_token_ids)
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
        """
        return render_chat(self._tokenizer, messages, add_generation_prompt)

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> TextPrompt:
        """The prompt of ``messages`` (string contents) with the generation prompt: a text model has no media.
        ``tools`` go to a template that renders them (``tool_format`` is not "generic"); ``template_kwargs`` to the
        template as variables (``enable_thinking``).

        Raises:
            InvalidSettingError: a message is not a role/content pair of strings.
        """
        return TextPrompt(tuple(render_chat(self._tokenizer, messages, True, tools, template_kwargs)))

    def encode(self, text: str) -> list[int]:
        """Token ids of plain ``text`` (no chat template, no special tokens added)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False))

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

    def forward_batch(self, feeds: Sequence[Any]) -> list[torch.Tensor | Exception | None]:
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


class TransformersAdapter(ModelAdapter):
    """transformers' forward behind the runtime interface, for the models :mod:`chat.models.decoder` does not cover
    (hybrid recurrent layers; multimodal stacks through :class:`~chat.models.multimodal.MultimodalAdapter`): the
    model is patched once (:func:`chat.models.fast_paths.install`) and run over :mod:`chat.models.hf_cache` caches,
    several runs at once through :mod:`chat.models.ragged`."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        fingerprint: str,
        dtype: str,
        context_window: int,
        eos_token_ids: set[int],
        weights: str = "float32",
        kv_dtype: str | None = None,
        rotating_margin: int = DEFAULT_ROTATING_MARGIN,
    ) -> None:
        super().__init__(
            tokenizer,
            name=name,
            fingerprint=fingerprint,
            kv_dtype=kv_dtype or dtype,
            context_window=context_window,
            eos_token_ids=eos_token_ids,
            weights=weights,
            vocab_size=int(model.get_output_embeddings().weight.shape[0]),
            device=next(model.parameters()).device,
            generation_config=getattr(model, "generation_config", None),
        )
        self._model = model  # a transformers causal LM in eval mode
        stored = getattr(torch, kv_dtype) if kv_dtype not in (None, dtype) else None  # None: as computed
        self._layout = CacheLayout(model.config, max_rows=context_window, margin=rotating_margin, kv_dtype=stored)
        self.has_recurrent_state = self._layout.has_recurrent  # snapshot boundaries matter
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        if self.has_recurrent_state:
            self._learn_recurrent_layout()
        calibration = self.encode(CALIBRATION_TEXT) if weights == "int8" else None
        self._patches = install(model, weights, calibration=calibration)  # weight format, fusion, packed attention
        self._packable = not self.has_recurrent_state  # runs share one forward (chat.models.ragged)
        self._packed_kinds = [  # per decoder layer, what a packed forward's cache holds
            "kv" if kinds == ("kv",) else ("rotating", slot_window) if kinds == ("rotating",) else "none"
            for kinds, slot_window in self._layout.layer_parts()
        ]

    # ================================================================ runs

    def new_run(self, lease: Lease | None = None, prompt: Any = None) -> RunState:
        """A run that is empty, or holds ``lease``'s state at ``lease.length`` (``prompt`` matters only to
        multimodal adapters).

        Attention K/V are adopted by reference; the run copies them only if it must append where another run
        already did (see :mod:`chat.models.kv_rows`). Keep the lease until the run is closed.

        Raises:
            RunStateError: the lease's layers do not fit this model.
        """
        cache = self._layout.new_cache()
        run = RunState(owner=id(self), state=cache, length=0)
        if lease is None:
            return run
        slots = self._layout.slots
        if len(lease.layers) != len(slots):
            raise RunStateError(f"the lease has {len(lease.layers)} layer states; {self.name} has {len(slots)} slots")
        for index, (slot, state) in enumerate(zip(slots, lease.layers, strict=True)):
            try:
                self._restore_slot(cache, index, slot, state, lease.length)
            except (TypeError, ValueError) as exc:
                raise RunStateError(f"slot {index} (layer {slot.layer}, {slot.kind}): {exc}") from exc
            inherited = lease.snapshots_upto[index] if index < len(lease.snapshots_upto) else None
            if slot.kind == "recurrent" and inherited:
                run.inherited[index] = inherited
        run.length = lease.length
        return run

    def forward_batch(self, feeds: Sequence[Any]) -> list[torch.Tensor | Exception | None]:
        """Append each feed's ``tokens`` to its ``run`` in as few forwards as the model allows; return, per feed,
        the logits ``[feed.logits, vocab]`` (float32) of its last ``feed.logits`` tokens (None for 0), or the error
        that feed caused. A feed is anything with ``run``, ``tokens`` and ``logits`` (``chat.engine.runtime.Feed``).

        Models without recurrent layers run every feed in one packed forward (:mod:`chat.models.ragged`). Models
        with recurrent layers run their one-token feeds (decode steps) in one stacked forward, one run per batch
        row, and every longer feed (a prefill chunk, drafts) in a forward of its own: a recurrent mixer carries
        state along its input row, so feeds cannot share a row. If a shared forward fails, every run is rolled back
        and each feed runs alone, so only the feeds that fail alone get an error (their runs are left broken); the
        others advance as if nothing had happened.

        Errors per feed: RunStateError (closed, broken or foreign run; over the context window), InvalidSettingError
        (no tokens, a token id outside the vocabulary, ``logits`` out of range), or whatever the model raised.
        """
        outcomes: list[torch.Tensor | Exception | None] = [None] * len(feeds)
        ready: list[tuple[int, RunState, int, dict[str, torch.Tensor]]] = []  # (feed index, run, logits, inputs)
        for i, feed in enumerate(feeds):
            try:
                run, ids = self._check_feed(feed)
                with torch.inference_mode():
                    inputs = self._model_inputs(run, ids)
            except Exception as exc:  # this feed only
                outcomes[i] = exc
                continue
            ready.append((i, run, feed.logits, inputs))
        if len(set(id(r) for _, r, _, _ in ready)) != len(ready):
            raise RunStateError("a run appears twice in one batch")
        together = ready if self._packable else [it for it in ready if _token_count(it[3]) == 1]
        if len(together) > 1:
            try:
                forward = self._forward_packed if self._packable else self._forward_stacked
                for (i, _, _, _), logits in zip(together, forward(together), strict=True):
                    outcomes[i] = logits
                ready = [it for it in ready if it not in together]
            except Exception as exc:  # rolled back: each feed runs alone below; only those that fail alone get an error
                _log.warning("a forward of %d feeds failed (%r); running them one by one", len(together), exc)
        for item in ready:
            try:
                outcomes[item[0]] = self._forward_alone(item)
            except Exception as exc:
                outcomes[item[0]] = exc
        return outcomes

    @property
    def can_rewind(self) -> bool:
        """True when :meth:`rewind` works: every layer keeps K/V rows (no recurrent state, which cannot go back)."""
        return not self.has_recurrent_state

    def rewind(self, run: RunState, n: int) -> None:
        """Forget the last ``n`` tokens the run absorbed, e.g. draft tokens that a verification rejected. Only
        tokens forwarded since the run was restored or last exported can go (cache entries may hold the others).

        Raises:
            RunStateError: the run is closed or broken, the model has recurrent layers, or ``n`` reaches too far.
        """
        cache = self._live(run)
        if n == 0:
            return
        if not self.can_rewind:
            raise RunStateError(f"{self.name} has recurrent layers: its runs cannot be rewound")
        rows = [cache.layers[s.layer].rows for s in self._layout.slots if s.kind in ("kv", "rotating")]
        if not 0 < n <= run.length or any(r.seen - n < max(r.floor, r.first) or not r.at_tip() for r in rows):
            raise RunStateError(f"cannot rewind {n} of the run's {run.length} tokens")
        for r in rows:
            r.drop_last(n)
        run.length -= n

    def snapshot(self, run: RunState) -> None:
        """Record the recurrent layers' state at ``run.length`` (a copy), so that :meth:`export` includes it.
        A no-op for models without recurrent layers, or before the first token."""
        cache = self._live(run)
        if not self.has_recurrent_state or run.length == 0:
            return
        with torch.inference_mode():
            for index, slot in enumerate(self._layout.slots):
                if slot.kind == "recurrent":
                    run.snapshots.setdefault(index, {})[run.length] = self._layout.take_state(cache, slot.layer)

    def export(self, run: RunState) -> list[LayerState]:
        """The run's state at ``run.length`` as cache layer states, one per slot.

        Attention K/V are views of the run's buffers (no copy); sliding layers keep up to W - 1 + margin rows.
        Recurrent layers carry every snapshot inherited from the lease plus those this run recorded; a snapshot at
        the current length is taken first if missing.

        Raises:
            RunStateError: the run is closed, broken or empty.
        """
        cache = self._live(run)
        if run.length == 0:
            raise RunStateError("nothing to export: the run has absorbed no tokens")
        if self._missing_snapshot(run):
            self.snapshot(run)
        out: list[LayerState] = []
        for index, slot in enumerate(self._layout.slots):
            if slot.kind in ("kv", "rotating"):
                out.append(cache.layers[slot.layer].rows.export())
            elif slot.kind == "recurrent":
                merged = dict(run.inherited.get(index, {}))
                merged.update(run.snapshots.get(index, {}))
                out.append(RecurrentState(merged))
            else:
                out.append(Stateless())
        return out

    def close_run(self, run: RunState) -> None:
        """The run is finished: drop its references (cache entries keep the rows they hold views of)."""
        run.state = None
        run.inherited.clear()
        run.snapshots.clear()

    @contextlib.contextmanager
    def stock_model(self) -> Iterator[Any]:
        """The transformers model exactly as loaded, for baselines such as HF ``generate``: the fast paths
        (:mod:`chat.models.fast_paths`) are undone while the block runs. No run may be driven meanwhile."""
        with self._patches.stock() as model:
            yield model

    # ================================================================ internals

    def _model_inputs(self, run: RunState, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """What the model is called with for ``ids`` ``[1, q]`` appended to ``run`` (before ``run.length`` grows).
        Text models: the ids and 1-D positions ``[length, length + q)``; multimodal adapters override this."""
        q = ids.shape[1]
        positions = torch.arange(run.length, run.length + q, device=self.device).unsqueeze(0)  # [1, q]
        return {"input_ids": ids, "position_ids": positions}

    def _blocks(self, run: RunState, q: int) -> tuple[tuple[int, int], ...]:
        """Ranges of the next ``q`` tokens of ``run`` (offsets into them, before ``run.length`` grows) whose tokens
        attend to each other both ways (:attr:`ragged.PackedRun.blocks`): none for text models."""
        return ()

    def _check_feed(self, feed: Any) -> tuple[RunState, torch.Tensor]:  # type: ignore[override]
        """The feed's run and its token ids ``[1, q]``, once both are known to fit."""
        run, token_ids = super()._check_feed(feed)
        return run, torch.tensor([token_ids], dtype=torch.long, device=self.device)

    def _forward_packed(self, items: Sequence[tuple[int, RunState, int, dict[str, torch.Tensor]]]) -> list[Any]:
        """One forward over every item's tokens laid end to end; all runs advance, or (on error) none does."""
        slots, keep, start = [], [], 0
        for _, run, logits, inputs in items:
            q = _token_count(inputs)
            slots.append(ragged.PackedRun(0, start, start + q, run.state, self._blocks(run, q)))
            keep.extend(range(start + q - logits, start + q))
            start += q
        merged = {
            name: torch.cat([inputs[name] for _, _, _, inputs in items], dim=-1 if name == "position_ids" else 1)
            for name in items[0][3]
        }
        pack = ragged.Pack(slots)
        points = [[r.checkpoint() for r in self._attention_rows(run)] for _, run, _, _ in items]
        try:
            logits = self._run_model(merged, ragged.RaggedCache(self._packed_kinds, pack), pack, keep)
        except BaseException:
            for (_, run, _, _), run_points in zip(items, points, strict=True):
                for rows, point in zip(self._attention_rows(run), run_points, strict=True):
                    rows.rollback(point)
            raise
        out, at = [], 0
        for _, run, n, inputs in items:
            run.length += _token_count(inputs)
            out.append(logits[at : at + n] if n else None)
            at += n
        return out

    def _forward_stacked(self, items: Sequence[tuple[int, RunState, int, dict[str, torch.Tensor]]]) -> list[Any]:
        """One forward of one token per run, the runs as batch rows; all advance, or (on error) none does."""
        pack = ragged.Pack([ragged.PackedRun(row, 0, 1, run.state) for row, (_, run, _, _) in enumerate(items)])
        merged = {
            name: torch.cat([inputs[name] for _, _, _, inputs in items], dim=-2 if name == "position_ids" else 0)
            for name in items[0][3]
        }
        cache, write_back = self._layout.stacked_cache([run.state for _, run, _, _ in items], pack)
        points = [[r.checkpoint() for r in self._attention_rows(run)] for _, run, _, _ in items]
        try:
            logits = self._run_model(merged, cache, pack, [0], rows=len(items))
        except BaseException:
            for (_, run, _, _), run_points in zip(items, points, strict=True):
                for rows, point in zip(self._attention_rows(run), run_points, strict=True):
                    rows.rollback(point)
            raise
        try:
            with torch.inference_mode():
                write_back()
        except BaseException:  # some runs may hold new states, some old: none can go on
            for _, run, _, _ in items:
                run.broken = True
            raise
        out = []
        for b, (_, run, n, _) in enumerate(items):
            run.length += 1
            out.append(logits[b : b + 1] if n else None)
        return out

    def _forward_alone(self, item: tuple[int, RunState, int, dict[str, torch.Tensor]]) -> torch.Tensor | None:
        """One forward for one run, on its own cache (recurrent layers included); a failure breaks the run."""
        _, run, n, inputs = item
        q = _token_count(inputs)
        pack = ragged.Pack([ragged.PackedRun(0, 0, q, run.state, self._blocks(run, q))])
        try:
            logits = self._run_model(inputs, run.state, pack, list(range(q - n, q)))
        except BaseException:
            run.broken = True
            raise
        run.length += q
        return logits if n else None

    def _run_model(
        self, inputs: dict[str, torch.Tensor], cache: Any, pack: Any, keep: list[int], rows: int = 0
    ) -> torch.Tensor:
        """Call the model; logits ``[len(keep), vocab]`` (float32) of the input positions ``keep`` of the one input
        row, or with ``rows`` batch rows of one position each, ``[rows, vocab]``."""
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {"logits_to_keep": index} if self._logits_to_keep else {}
        with torch.inference_mode(), ragged.active(pack):
            out = self._model(**inputs, past_key_values=cache, use_cache=True, **kwargs)
            logits = out.logits if self._logits_to_keep else out.logits[:, index]  # [B, len(keep), vocab]
        return (logits[:, 0] if rows else logits[0]).float()

    def _attention_rows(self, run: RunState) -> list[Any]:
        cache = self._live(run)
        return [cache.layers[s.layer].rows for s in self._layout.slots if s.kind in ("kv", "rotating")]

    def _missing_snapshot(self, run: RunState) -> bool:
        """True if some recurrent slot has no snapshot at the run's current length."""
        return any(
            run.length not in run.snapshots.get(i, {}) and run.length not in run.inherited.get(i, {})
            for i, slot in enumerate(self._layout.slots)
            if slot.kind == "recurrent"
        )

    def _restore_slot(self, cache: RunCache, index: int, slot: Any, state: Any, length: int) -> None:
        if slot.kind in ("kv", "rotating"):
            want = NormalKV if slot.kind == "kv" else RotatingKV
            if not isinstance(state, want):
                raise TypeError(f"expected {want.__name__}, got {type(state).__name__}")
            rows = cache.layers[slot.layer].rows
            rows.restore(state)
            if rows.seen != length:
                raise ValueError(f"holds {rows.seen} tokens, the lease {length}")
        elif slot.kind == "recurrent":
            if not isinstance(state, RecurrentSnapshot) or state.length != length:
                raise TypeError(f"expected a RecurrentSnapshot at {length}, got {state!r}")
            self._layout.put_state(cache, slot.layer, state.tensors)
        elif not isinstance(state, Stateless):
            raise TypeError(f"expected Stateless, got {type(state).__name__}")

    def _learn_recurrent_layout(self) -> None:
        """Run one token through a scratch cache to see which conv / recurrent states each layer keeps."""
        cache = self._layout.new_cache()
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        with torch.inference_mode():
            self._model(input_ids=ids, position_ids=ids, past_key_values=cache, use_cache=True)
        self._layout.learn_recurrent(cache)


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """A rendered text prompt (the ``RenderedPrompt`` of ``chat.engine.runtime``)."""

    tokens: tuple[int, ...]  # token ids through the chat template, generation prompt included
    spans: tuple[()] = ()  # no media


def _token_count(inputs: Mapping[str, torch.Tensor]) -> int:
    return int(inputs["position_ids"].shape[-1])
