"""A transformers ``Cache`` whose attention layers grow into preallocated, copy-on-write buffers
(:class:`chat.models.kv_rows.AttentionRows`), and the mapping between its layers and cache layer states.

Each decoder layer becomes one or two *slots* (a hybrid layer has an attention part and a recurrent part)::

    slot kind   transformers layer part                      cache state      restored from
    "kv"        full attention K/V                           NormalKV         NormalKV (adopted by reference)
    "rotating"  sliding-window K/V                           RotatingKV       RotatingKV (adopted by reference)
    "recurrent" conv / SSM / linear-attention states         RecurrentState   RecurrentSnapshot (already a copy)
    "none"      nothing (shared K/V, attention-free layer)   Stateless        Stateless

Recurrent tensors are ordered conv states first, then recurrent states, each by ``state_idx``
(:class:`RecurrentLayout`). Transformers updates them in place, so snapshots are clones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
    get_layer_types_and_kwargs,
)

from chat.models.families import LAYER_KINDS
from chat.models.hf import ragged
from chat.models.kv_rows import AttentionRows

_TAKEN_ATTR = "_turncache_taken"  # set on recurrent tensors a run has installed (and will update in place)


class _BufferedKV:
    """Mixin: the attention part of a layer lives in ``self.rows`` instead of growing with ``torch.cat``."""

    rows: AttentionRows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        keys, values = self.rows.append(key_states, value_states)  # [B, H, kv_length, D]
        self.keys, self.values = keys, values  # what other transformers code may read
        self.is_initialized = True
        pack = ragged.current()
        if pack is not None:  # a one-run forward (chat.models.hf.ragged): attention reads the views from the pack
            pack.kv, pack.window = [(keys[0], values[0])], self.rows.window
        elif keys.dtype != key_states.dtype:  # rows stored in another dtype, read by transformers' own attention
            return keys.to(key_states.dtype), values.to(value_states.dtype)
        return keys, values

    def get_seq_length(self) -> int:
        return self.rows.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.rows.mask_sizes(query_length)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("turncache runs are never cropped: restore a cache entry instead")


class BufferedFullLayer(_BufferedKV, DynamicLayer):
    def __init__(self, rows: AttentionRows) -> None:
        DynamicLayer.__init__(self)
        self.rows = rows  # this run's K/V for the layer


class BufferedSlidingLayer(_BufferedKV, DynamicSlidingWindowLayer):
    def __init__(self, rows: AttentionRows) -> None:
        DynamicSlidingWindowLayer.__init__(self, sliding_window=rows.window)
        self.rows = rows


class BufferedHybridLayer(_BufferedKV, LinearAttentionAndFullAttentionLayer):
    def __init__(self, rows: AttentionRows, number_of_states: int) -> None:
        LinearAttentionAndFullAttentionLayer.__init__(self, number_of_states=number_of_states)
        self.rows = rows


class BufferedHybridSlidingLayer(_BufferedKV, LinearAttentionAndSlidingWindowAttentionLayer):
    def __init__(self, rows: AttentionRows, number_of_states: int) -> None:
        LinearAttentionAndSlidingWindowAttentionLayer.__init__(
            self, sliding_window=rows.window, number_of_states=number_of_states
        )
        self.rows = rows


def _stack_states(layer: Any, owns: Sequence[Any]) -> None:
    """Give ``layer`` the runs' recurrent states (layers ``owns``, one per run) stacked along the batch dimension."""
    first = owns[0]
    for idx, ready in first.is_conv_states_initialized.items():
        if ready:
            layer.conv_states[idx] = torch.cat([own.conv_states[idx] for own in owns])
            layer.is_conv_states_initialized[idx] = True
            layer.conv_kernel_size[idx] = first.conv_kernel_size[idx]
    for idx, ready in first.is_recurrent_states_initialized.items():
        if ready:
            layer.recurrent_states[idx] = torch.cat([own.recurrent_states[idx] for own in owns])
            layer.is_recurrent_states_initialized[idx] = True
    layer.has_previous_state = dict(first.has_previous_state)
    layer.device, layer.dtype = first.device, first.dtype


class RunCache(Cache):
    """The cache one run feeds to the model: one layer object per decoder layer."""

    def __init__(self, layers: list[Any]) -> None:
        super().__init__(layers=layers)


@dataclass(frozen=True, slots=True)
class CacheSlot:
    layer: int  # decoder layer index
    kind: str  # "kv" | "rotating" | "recurrent" | "none"
    window: int | None  # sliding window W of "rotating" slots


@dataclass(frozen=True, slots=True)
class RecurrentLayout:
    """Which states a recurrent layer holds, in snapshot order: ``(("conv", 0), ("recurrent", 0))`` etc."""

    states: tuple[tuple[str, int], ...]


class CacheLayout:
    """How a model's decoder layers map onto slots, and how to build a fresh :class:`RunCache` for it."""

    def __init__(self, config: Any, *, max_rows: int, margin: int, kv_dtype: torch.dtype | None = None) -> None:
        text = config.get_text_config(decoder=True)
        self.layer_types, self._layer_kwargs = get_layer_types_and_kwargs(text)
        self.max_rows = max_rows  # the context window: full buffers do not grow past it
        self.margin = margin  # rows kept beyond W - 1 in sliding layers, so short rewinds stay possible
        self.kv_dtype = kv_dtype  # what attention rows are stored in (None: the dtype the model computes them in)
        slots: list[CacheSlot] = []
        for i, (kind, kwargs) in enumerate(zip(self.layer_types, self._layer_kwargs, strict=True)):
            for part in LAYER_KINDS[kind]:
                slots.append(CacheSlot(i, part, kwargs.get("sliding_window") if part == "rotating" else None))
        self.slots: tuple[CacheSlot, ...] = tuple(slots)
        self.recurrent: dict[int, RecurrentLayout] = {}  # layer -> its states; filled in by `learn_recurrent`

    def layer_parts(self) -> list[tuple[tuple[str, ...], int | None]]:
        """Per decoder layer: the kinds of its slots, and the sliding window of its attention part (if any)."""
        parts: list[tuple[tuple[str, ...], int | None]] = [((), None) for _ in self.layer_types]
        for slot in self.slots:
            kinds, window = parts[slot.layer]
            parts[slot.layer] = ((*kinds, slot.kind), slot.window if slot.window is not None else window)
        return parts

    @property
    def has_recurrent(self) -> bool:
        return any(s.kind == "recurrent" for s in self.slots)

    def new_cache(self) -> RunCache:
        layers: list[Any] = []
        for kind, kwargs in zip(self.layer_types, self._layer_kwargs, strict=True):
            n_states = kwargs.get("number_of_states", 1)
            window = kwargs.get("sliding_window")
            if kind == "full_attention":
                layers.append(BufferedFullLayer(self._rows(None)))
            elif kind == "sliding_attention":
                layers.append(BufferedSlidingLayer(self._rows(window)))
            elif kind in ("conv", "linear_attention"):
                layers.append(LinearAttentionLayer(number_of_states=n_states))
            elif kind == "hybrid":
                layers.append(BufferedHybridLayer(self._rows(None), n_states))
            elif kind == "hybrid_sliding":
                layers.append(BufferedHybridSlidingLayer(self._rows(window), n_states))
            else:
                layers.append(DummyLayer())
        return RunCache(layers)

    def stacked_cache(self, caches: Sequence[RunCache], pack: ragged.Pack) -> tuple[Cache, Callable[[], None]]:
        """The cache of one forward of one token per run, the runs as batch rows (``pack``'s slots, in order of
        ``caches``): attention parts route K/V to each run's own rows, recurrent states are stacked *copies* of the
        runs' states. Returns it and ``write_back``: copy the new states into each run's own tensors; call it only
        once the forward succeeded (until then the runs are untouched, but for rows appended to their attention)."""
        layers: list[Any] = []
        stacked: list[tuple[int, Any]] = []  # (decoder layer, its stacked recurrent layer)
        for i, (kind, kwargs) in enumerate(zip(self.layer_types, self._layer_kwargs, strict=True)):
            n_states, window = kwargs.get("number_of_states", 1), kwargs.get("sliding_window")
            if kind == "full_attention":
                layers.append(ragged.RaggedFullLayer(i, pack))
                continue
            if kind == "sliding_attention":
                layers.append(ragged.RaggedSlidingLayer(i, pack, window))
                continue
            if kind in ("conv", "linear_attention"):
                layer: Any = LinearAttentionLayer(number_of_states=n_states)
            elif kind == "hybrid":
                layer = ragged.RaggedHybridLayer(i, pack, n_states)
            elif kind == "hybrid_sliding":
                layer = ragged.RaggedHybridSlidingLayer(i, pack, window, n_states)
            else:
                layers.append(DummyLayer())
                continue
            _stack_states(layer, [c.layers[i] for c in caches])
            layers.append(layer)
            stacked.append((i, layer))

        def write_back() -> None:
            for i, layer in stacked:
                for row, cache in enumerate(caches):
                    own = cache.layers[i]
                    for idx, tensor in layer.conv_states.items():
                        if tensor is not None and own.conv_states.get(idx) is not None:
                            own.conv_states[idx].copy_(tensor[row : row + 1])
                    for idx, tensor in layer.recurrent_states.items():
                        if tensor is not None and own.recurrent_states.get(idx) is not None:
                            own.recurrent_states[idx].copy_(tensor[row : row + 1])

        return RunCache(layers), write_back

    def _rows(self, window: int | None) -> AttentionRows:
        keep = 0 if window is None else window - 1 + self.margin
        return AttentionRows(window, keep, self.max_rows, self.kv_dtype)

    # ---------------------------------------------------------------- recurrent state

    def learn_recurrent(self, cache: RunCache) -> None:
        """Record which states each recurrent layer holds, from a cache that has run at least one token."""
        for slot in self.slots:
            if slot.kind != "recurrent":
                continue
            layer = cache.layers[slot.layer]
            states = [("conv", i) for i, ok in sorted(layer.is_conv_states_initialized.items()) if ok]
            states += [("recurrent", i) for i, ok in sorted(layer.is_recurrent_states_initialized.items()) if ok]
            self.recurrent[slot.layer] = RecurrentLayout(tuple(states))

    def take_state(self, cache: RunCache, layer: int) -> tuple[torch.Tensor, ...]:
        """Clones of a recurrent layer's states, in layout order."""
        hf = cache.layers[layer]
        out = []
        for kind, i in self.recurrent[layer].states:
            tensor = hf.conv_states[i] if kind == "conv" else hf.recurrent_states[i]
            out.append(tensor.clone())
        return tuple(out)

    def put_state(self, cache: RunCache, layer: int, tensors: tuple[torch.Tensor, ...]) -> None:
        """Install a lease's private copies of a recurrent layer's states; the model updates them in place.

        A lease's copies serve one run: if they were installed before (a lease reused), they are cloned first.
        """
        hf = cache.layers[layer]
        assert isinstance(hf, LinearAttentionCacheLayerMixin)
        layout = self.recurrent[layer].states
        if len(tensors) != len(layout):
            raise ValueError(f"layer {layer}: expected {len(layout)} recurrent tensors, got {len(tensors)}")
        for (kind, i), given in zip(layout, tensors, strict=True):
            tensor = given.clone() if getattr(given, _TAKEN_ATTR, False) else given
            setattr(tensor, _TAKEN_ATTR, True)
            if kind == "conv":
                hf.conv_states[i] = tensor
                hf.conv_kernel_size[i] = tensor.shape[-1]
                hf.is_conv_states_initialized[i] = True
            else:
                hf.recurrent_states[i] = tensor
                hf.is_recurrent_states_initialized[i] = True
            hf.has_previous_state[i] = True
            hf.device, hf.dtype = tensor.device, tensor.dtype
