"""transformers' forward behind the runtime interface (:class:`TransformersAdapter`), for the models turncache's
own decoder (:mod:`chat.models.decoder.model`) does not compute yet:

- hybrid recurrent models (``qwen3_next``, ``lfm2``, ``falcon_h1``, ``granitemoehybrid``, ``zamba2``: gated delta-net
  linear attention, short convolutions, Mamba-2 scans), whose mixers and their states are transformers' code;
- multimodal models (:class:`chat.models.hf.multimodal.MultimodalAdapter`: Qwen2-VL / 2.5-VL / Omni, LLaVA, SmolVLM,
  Mistral 3, Gemma 3, Qwen3.5, Qwen3-VL), whose encoders, media merging, 3-D positions and deepstack features are.

The model is patched once (:func:`chat.models.hf.fast_paths.install`: weight formats, fused projections, the packed
attention registered with transformers) and runs over :mod:`chat.models.hf.run_cache` caches, several runs per forward
through :mod:`chat.models.hf.ragged`. Baselines load a stock model of their own (``chat.tools.testing.baselines``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from cache import LayerState, Lease, NormalKV, RecurrentSnapshot, RecurrentState, RotatingKV, Stateless
from chat.models.adapter import DEFAULT_ROTATING_MARGIN, ModelAdapter, RunState
from chat.models.errors import RunStateError
from chat.models.hf import ragged
from chat.models.hf.fast_paths import install
from chat.models.hf.run_cache import CacheLayout, RunCache
from chat.models.kv_rows import drop_last_of_run
from chat.models.smoothing import CALIBRATION_TEXT

_log = logging.getLogger(__name__)


class TransformersAdapter(ModelAdapter):
    """transformers' forward behind the runtime interface, for the models :mod:`chat.models.decoder.model` does not
    cover (hybrid recurrent layers; multimodal stacks through :class:`~chat.models.hf.multimodal.MultimodalAdapter`):
    the model is patched once (:func:`chat.models.hf.fast_paths.install`) and run over :mod:`chat.models.hf.run_cache`
    caches, several runs at once through :mod:`chat.models.hf.ragged`."""

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
        self._packable = not self.has_recurrent_state  # runs share one forward (chat.models.hf.ragged)
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

    def forward_batch(
        self, feeds: Sequence[Any], interrupt: Callable[[], bool] | None = None
    ) -> list[torch.Tensor | Exception | None]:
        """Append each feed's ``tokens`` to its ``run`` in as few forwards as the model allows; return, per feed,
        the logits ``[feed.logits, vocab]`` (float32) of its last ``feed.logits`` tokens (None for 0), or the error
        that feed caused. A feed is anything with ``run``, ``tokens`` and ``logits`` (``chat.engine.runtime.Feed``).

        Models without recurrent layers run every feed in one packed forward (:mod:`chat.models.hf.ragged`). Models
        with recurrent layers run their one-token feeds (decode steps) in one stacked forward, one run per batch
        row, and every longer feed (a prefill chunk, drafts) in a forward of its own: a recurrent mixer carries
        state along its input row, so feeds cannot share a row. If a shared forward fails, every run is rolled back
        and each feed runs alone, so only the feeds that fail alone get an error (their runs are left broken); the
        others advance as if nothing had happened.

        Errors per feed: RunStateError (closed, broken or foreign run; over the context window), InvalidSettingError
        (no tokens, a token id outside the vocabulary, ``logits`` out of range), or whatever the model raised.

        ``interrupt`` is not asked: transformers' forward runs its layers to the end (no place to stop between them
        without reaching into it), so these models' steps are never interrupted.
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
        drop_last_of_run(rows, n, run.length)
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


def _token_count(inputs: Mapping[str, torch.Tensor]) -> int:
    return int(inputs["position_ids"].shape[-1])
