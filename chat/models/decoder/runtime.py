"""The runtime of a model computed by turncache's own decoder forward (:mod:`chat.models.decoder.model`): the families
whose every layer is attention. A run is its K/V rows, one :class:`chat.models.kv_rows.AttentionRows` per layer (a
cache entry holds views of them: ``NormalKV`` for full attention, ``RotatingKV`` for sliding layers); every feed of
a step goes into one forward (:class:`chat.models.attention.StepBatch`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cache import LayerState, Lease, NormalKV, RotatingKV
from chat.engine.runtime import StepInterrupted
from chat.models import attention
from chat.models.adapter import DEFAULT_ROTATING_MARGIN, ModelAdapter, RunState
from chat.models.decoder.lora import AdapterBank, LoraAdapter
from chat.models.decoder.model import Decoder
from chat.models.errors import RunStateError
from chat.models.kernels import native
from chat.models.kv_rows import AttentionRows, drop_last_of_run

_log = logging.getLogger(__name__)


class DecoderAdapter(ModelAdapter):
    """A :class:`~chat.models.adapter.ModelAdapter` over a :class:`~chat.models.decoder.model.Decoder`."""

    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Any,
        *,
        name: str,
        fingerprint: str,
        kv_dtype: str,
        context_window: int,
        eos_token_ids: set[int],
        weights: str,
        generation_config: Any = None,
        rotating_margin: int = DEFAULT_ROTATING_MARGIN,
    ) -> None:
        super().__init__(
            tokenizer,
            name=name,
            fingerprint=fingerprint,
            kv_dtype=kv_dtype,
            context_window=context_window,
            eos_token_ids=eos_token_ids,
            weights=weights,
            vocab_size=decoder.args.vocab_size,
            device=decoder.device,
            generation_config=generation_config,
        )
        self._model = decoder  # the forward
        self._rows_dtype = getattr(torch, kv_dtype)  # what K/V rows are stored in
        self._margin = rotating_margin  # rows kept beyond W - 1 in sliding layers: rewinds of up to this many
        if self.device.type == "cpu":
            native.kernels()  # built (once per machine) or loaded now, at load time, rather than by the first request
        self.adapters = (
            AdapterBank(  # LoRA adapters by name (chat.models.decoder.lora); int8 products for exact formats
                decoder, self.device, int8=weights not in ("float32", "bfloat16")
            )
        )

    # ================================================================ runs

    def new_run(
        self, lease: Lease | None = None, prompt: Any = None, *, adapter: LoraAdapter | None = None
    ) -> RunState:
        """A run that is empty, or holds ``lease``'s state at ``lease.length`` (``prompt`` is not needed), computed
        under the LoRA ``adapter`` (None: the base model). The lease must come from the adapter's namespace.

        Attention K/V are adopted by reference; the run copies them only if it must append where another run
        already did (see :mod:`chat.models.kv_rows`). Keep the lease until the run is closed.

        Raises:
            RunStateError: the lease's layers do not fit this model.
        """
        windows = self._model.args.windows
        rows = [
            AttentionRows(w, 0 if w is None else w - 1 + self._margin, self.context_window, self._rows_dtype)
            for w in windows
        ]
        if adapter is not None and not isinstance(adapter, LoraAdapter):
            raise RunStateError(f"expected a LoraAdapter, got {type(adapter).__name__}")
        run = RunState(owner=id(self), state=rows, length=0, lora=adapter)
        if lease is None:
            return run
        if len(lease.layers) != len(rows):
            raise RunStateError(f"the lease has {len(lease.layers)} layer states; {self.name} has {len(rows)} layers")
        for i, (layer, state) in enumerate(zip(rows, lease.layers, strict=True)):
            want = NormalKV if layer.window is None else RotatingKV
            try:
                if not isinstance(state, want):
                    raise TypeError(f"expected {want.__name__}, got {type(state).__name__}")
                layer.restore(state)
                if layer.seen != lease.length:
                    raise ValueError(f"holds {layer.seen} tokens, the lease {lease.length}")
            except (TypeError, ValueError) as exc:
                raise RunStateError(f"layer {i}: {exc}") from exc
        run.length = lease.length
        return run

    def forward_batch(
        self, feeds: Sequence[Any], interrupt: Callable[[], bool] | None = None
    ) -> list[torch.Tensor | Exception | None]:
        """Append each feed's ``tokens`` to its ``run`` in one forward; return, per feed, the logits
        ``[feed.logits, vocab]`` (float32) of its last ``feed.logits`` tokens (None for 0), or the error that feed
        caused. A feed is anything with ``run``, ``tokens`` and ``logits`` (``chat.engine.runtime.Feed``).

        ``interrupt`` is asked between layers; when it returns True every run is rolled back (K/V rows appended by
        the layers done are forgotten) and :class:`~chat.engine.runtime.StepInterrupted` is raised.

        If the shared forward fails, every run is rolled back and each feed runs alone, so only the feeds that fail
        alone get an error (their runs are left broken); the others advance as if nothing had happened.

        Errors per feed: RunStateError (closed, broken or foreign run; over the context window), InvalidSettingError
        (no tokens, a token id outside the vocabulary, ``logits`` out of range), or whatever the model raised.
        """
        outcomes: list[torch.Tensor | Exception | None] = [None] * len(feeds)
        ready: list[tuple[int, RunState, list[int], int]] = []  # (feed index, run, token ids, logits wanted)
        for i, feed in enumerate(feeds):
            try:
                run, ids = self._check_feed(feed)
            except Exception as exc:  # this feed only
                outcomes[i] = exc
                continue
            ready.append((i, run, ids, feed.logits))
        if len({id(run) for _, run, _, _ in ready}) != len(ready):
            raise RunStateError("a run appears twice in one batch")
        for part in self._by_residency(ready):  # one forward unless more adapters than --max-loras take part
            self._forward_ready(part, outcomes, interrupt)
            interrupt = None  # a forward done is kept: later parts run to the end
        return outcomes

    def _by_residency(self, ready: list) -> list[list]:
        """``ready`` cut into parts of at most ``max_loras`` adapters each (base rows go with the first part)."""
        most = max(1, self.adapters.max_loras)
        parts: list[list] = [[]]
        held: list[set[str]] = [set()]  # the adapters of each part
        for item in ready:
            lora, where = item[1].lora, 0
            if lora is not None:
                found = [i for i, ids in enumerate(held) if lora.identity in ids]
                room = [i for i, ids in enumerate(held) if len(ids) < most]
                if found or room:
                    where = (found or room)[0]
                else:
                    parts.append([])
                    held.append(set())
                    where = len(parts) - 1
                held[where].add(lora.identity)
            parts[where].append(item)
        return [p for p in parts if p]

    def _forward_ready(
        self, ready: list, outcomes: list[torch.Tensor | Exception | None], interrupt: Callable[[], bool] | None
    ) -> None:
        """Compute the ``ready`` feeds in one forward (each alone if that fails), their results into ``outcomes``."""
        if len(ready) > 1:
            try:
                for (i, _, _, _), logits in zip(ready, self._forward(ready, interrupt), strict=True):
                    outcomes[i] = logits
                return
            except StepInterrupted:  # rolled back: nothing was computed, nothing failed
                raise
            except Exception as exc:  # rolled back: each feed runs alone below; only those that fail alone get one
                _log.warning("a forward of %d feeds failed (%r); running them one by one", len(ready), exc)
                interrupt = None  # the fallback runs to the end: the work of one step, already paid for once
        for item in ready:
            try:
                (outcomes[item[0]],) = self._forward([item], interrupt)
            except StepInterrupted:  # only a single feed gets here with an interrupt: rolled back like a batch
                raise
            except Exception as exc:
                item[1].broken = True
                outcomes[item[0]] = exc

    @property
    def can_rewind(self) -> bool:
        """True: every layer keeps K/V rows."""
        return True

    def rewind(self, run: RunState, n: int) -> None:
        """Forget the last ``n`` tokens the run absorbed, e.g. draft tokens that a verification rejected. Only
        tokens forwarded since the run was restored or last exported can go (cache entries may hold the others).

        Raises:
            RunStateError: the run is closed or broken, or ``n`` reaches too far.
        """
        rows: list[AttentionRows] = self._live(run)
        if n == 0:
            return
        drop_last_of_run(rows, n, run.length)
        run.length -= n

    def snapshot(self, run: RunState) -> None:
        """Nothing to record: no layer is recurrent."""
        self._live(run)

    def export(self, run: RunState) -> list[LayerState]:
        """The run's state at ``run.length`` as cache layer states, one per layer: views of the run's buffers (no
        copy); sliding layers keep up to W - 1 + margin rows.

        Raises:
            RunStateError: the run is closed, broken or empty.
        """
        rows: list[AttentionRows] = self._live(run)
        if run.length == 0:
            raise RunStateError("nothing to export: the run has absorbed no tokens")
        return [r.export() for r in rows]

    def close_run(self, run: RunState) -> None:
        """The run is finished: drop its references (cache entries keep the rows they hold views of)."""
        run.state = None

    # ================================================================ internals

    def _forward(
        self, items: Sequence[tuple[int, RunState, list[int], int]], interrupt: Callable[[], bool] | None = None
    ) -> list[torch.Tensor | None]:
        """One forward over every item's tokens laid end to end; all runs advance, or (on error or interruption)
        none does."""
        step = attention.step_batch([(ids, run.length, run.state, n) for _, run, ids, n in items], self.device)
        points = [[r.checkpoint() for r in run.state] for _, run, _, _ in items]
        try:
            with torch.inference_mode():
                self.adapters.begin(self._lora_rows(items, step))
                kernel = attention.kernel_for(self.device, self._rows_dtype)
                logits = self._model(input_ids=step.tokens, step=step, kernel=kernel, interrupt=interrupt)
        except BaseException:
            for (_, run, _, _), run_points in zip(items, points, strict=True):
                for rows, point in zip(run.state, run_points, strict=True):
                    rows.rollback(point)
            raise
        finally:
            self.adapters.end()
        out: list[torch.Tensor | None] = []
        at = 0
        for _, run, ids, n in items:
            run.length += len(ids)
            out.append(logits[at : at + n] if n else None)
            at += n
        return out

    def _lora_rows(self, items: Sequence[tuple[int, RunState, list[int], int]], step: Any) -> list:
        """The adapter of each token row of the step (None: the base model)."""
        rows: list[LoraAdapter | None] = []
        for (_, run, _, _), seq in zip(items, step.seqs, strict=True):
            rows.extend([run.lora] * (seq.end - seq.start))
        return rows
