"""One forward over several runs: their new tokens laid end to end in one input row, each token attending only to
its own run's K/V rows (ragged batching; no padding, no copy of anyone's K/V).

Linear layers, norms, embeddings and rotary positions work on tokens one by one, so they run over the concatenated
tokens of every run at once; only attention needs to know where each run's tokens are. A :class:`Pack` says that
(one :class:`PackedRun` per run: its row, its token range, its own cache), and two small pieces make transformers'
decoder code honour it:

- :class:`RaggedCache` stands in for the ``past_key_values`` of the forward. When an attention layer hands it the new
  K/V of all tokens, it appends each run's slice to that run's own :class:`~chat.models.kv_rows.AttentionRows` and
  keeps the views those return (the run's whole visible K/V) on the pack for the attention function. With the
  native kernels (:mod:`chat.models.kernels.native`), a one-token run's row is only reserved (:class:`Reserved`): the
  attention kernel writes its K/V there, so a decode step makes no tensor operation per run and layer.
- :func:`ragged_attention` is registered in transformers' ``AttentionInterface`` as :data:`RAGGED_ATTENTION` (and not
  in its mask interface, so no mask is built for the packed row). It computes each run's attention over that run's
  rows: one-token queries (decoding) see every row they are given, longer queries (prefill chunks, draft
  verification) have a causal (and sliding-window) mask of their own. The native kernel takes every run of a
  forward in one call per layer, and computes each query token the same way whatever else is in the call, so a
  position's attention does not depend on how the prompt was cut into chunks: with int8 weights (whose linear
  layers are exact per token too) a turn restored from the cache gives bit for bit the logits of the same turn
  computed from scratch. Without the kernels (or for other dtypes) each run goes through torch: one-token queries
  as a grouped matmul, short chunks as matmuls with a mask, long ones with SDPA, whose results differ in the last
  bits from one chunking to another.

::

    pack = Pack([PackedRun(row=0, start=0, end=5, cache=run_a_cache), PackedRun(0, 5, 6, run_b_cache)])
    with active(pack):
        model(input_ids=ids, position_ids=positions, past_key_values=RaggedCache(layout, pack), ...)

Outside a pack (the model called on its own, e.g. a baseline) the attention function computes what SDPA computes.
Runs of models with recurrent layers are not packed: a recurrent mixer carries state along its input row, so
packed runs would leak into each other. Their decode steps (one token per run) are *stacked* instead: one run per
batch row, attention routed per row the same way, recurrent states stacked into batch tensors
(:meth:`chat.models.hf.run_cache.CacheLayout.stacked_cache`). Their prefill chunks run one per forward. Not thread-safe:
one thread drives a model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from chat.models.attention import attend, causal_mask
from chat.models.kernels import native

RAGGED_ATTENTION = "turncache_ragged"  # our entry in transformers' attention interface


@dataclass(slots=True)
class PackedRun:
    """Where one run's new tokens sit in the packed input."""

    row: int  # batch row of the input ([B, S]); 0 when every run shares one row
    start: int  # first token of the run in that row
    end: int  # one past its last token
    cache: Any  # the run's own cache (chat.models.hf.run_cache.RunCache): its attention layers own its K/V rows
    blocks: tuple[tuple[int, int], ...] = ()  # [a, b) offsets into the slot's tokens that attend to each other both
    # ways (Gemma 3's image tokens), besides the causal mask; a sliding window still bounds what lies behind


@dataclass(slots=True, eq=False)
class Pack:
    """The runs of one forward. :class:`RaggedCache` fills :attr:`kv` per layer, :func:`ragged_attention` takes it."""

    slots: Sequence[PackedRun]  # in input order
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # the current layer's K/V views per slot
    window: int | None = None  # the current layer's sliding window (None: full attention)
    table: native.AttentionTable | None = None  # the current layer's native attention rows of reserved slots
    _masks: dict[tuple[int, int, int | None], torch.Tensor] = field(default_factory=dict)  # (q, kv, window) -> mask

    def mask(self, q: int, kv: int, window: int | None, device: torch.device) -> torch.Tensor:
        """Boolean ``[q, kv]`` (True = attend): the last ``q`` of ``kv`` positions are the queries; each sees itself
        and what precedes it, within ``window`` positions if one is given."""
        key = (q, kv, window)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = causal_mask(q, kv, window, device)
        return mask


_active: list[Pack] = []  # packs of the forwards in progress (innermost last)


def current() -> Pack | None:
    """The pack of the forward in progress, if any."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def active(pack: Pack) -> Iterator[Pack]:
    """Make ``pack`` the one :func:`ragged_attention` and :class:`RaggedCache` work with while the block runs."""
    _active.append(pack)
    try:
        yield pack
    finally:
        _active.pop()


# ==================================================================== the cache


class _RaggedKV:
    """Mixin for one attention layer of a :class:`RaggedCache`: K/V go to each slot's own rows."""

    layer_idx: int
    pack: Pack

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.pack.kv, self.pack.window, self.pack.table = route_kv(self.pack, self.layer_idx, key_states, value_states)
        self.is_initialized = True
        return key_states, value_states

    def get_seq_length(self) -> int:
        raise NotImplementedError("a packed forward has one length per run; pass position_ids explicitly")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0  # no mask is built for a packed row (see the module docstring)


class Reserved:
    """Stands for a one-token slot's K/V views: its rows were reserved by
    :meth:`~chat.models.kv_rows.AttentionRows.reserve_row`, which added the native attention kernel's row for it to
    the layer's table (:attr:`Pack.table`); the kernel writes its new K/V there."""

    __slots__ = ()


RESERVED = Reserved()


def route_kv(
    pack: Pack, layer_idx: int, key_states: torch.Tensor, value_states: torch.Tensor
) -> tuple[list[Any], int | None, native.AttentionTable | None]:
    """Append each slot's new K/V (``[B, Hk, S, D]``, all slots' tokens) to that slot's rows of layer ``layer_idx``;
    return per slot its visible K/V as ``[Hk, kv, D]`` views, the layer's sliding window, and the native kernel's
    table of the reserved slots. One-token slots (decode steps, the common case) take a shorter path: a decode step
    of many runs makes this call once per slot and layer. With the native kernels their rows are only reserved (a
    :class:`Reserved` view, their row in the table): the kernel writes them."""
    views: list[Any] = []
    window = None
    table: native.AttentionTable | None = None  # the native kernel's rows of the reserved slots
    tokens: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None = None  # per-token [Hk, D] views
    like: tuple[torch.Tensor, torch.Tensor] | None = None  # [1, Hk, 1, D]: one token's shapes, for reservations
    reserve = (
        key_states.dtype == value_states.dtype == torch.float32
        and key_states.stride(-1) == value_states.stride(-1) == 1
        and native.kernels() is not None
    )
    if reserve:  # where token (b, s)'s new K/V lie: base + b * batch stride + s * token stride (bytes)
        k_at, k_batch, k_token = key_states.data_ptr(), key_states.stride(0) * 4, key_states.stride(2) * 4
        v_at, v_batch, v_token = value_states.data_ptr(), value_states.stride(0) * 4, value_states.stride(2) * 4
    width = key_states.shape[2]  # S
    for slot in pack.slots:
        rows = slot.cache.layers[layer_idx].rows
        window = rows.window
        if slot.end - slot.start == 1:
            if reserve and (rows.dtype or key_states.dtype) in native.KV_DTYPES:
                if like is None:
                    like = key_states[:1, :, :1], value_states[:1, :, :1]
                if table is None:
                    table = native.AttentionTable(len(pack.slots))
                rows.reserve_row(
                    table,
                    *like,
                    first=slot.row * width + slot.start,
                    new_key=k_at + slot.row * k_batch + slot.start * k_token,
                    new_value=v_at + slot.row * v_batch + slot.start * v_token,
                )
                views.append(RESERVED)
                continue
            at = slot.row * width + slot.start
            if tokens is None:
                tokens = (
                    key_states.transpose(1, 2).flatten(0, 1).unbind(0),
                    value_states.transpose(1, 2).flatten(0, 1).unbind(0),
                )
            views.append(rows.append_token(tokens[0][at], tokens[1][at]))
            continue
        k = key_states[slot.row : slot.row + 1, :, slot.start : slot.end]  # [1, Hk, q, D]
        v = value_states[slot.row : slot.row + 1, :, slot.start : slot.end]
        keys, values = rows.append(k, v)  # [1, Hk, kv, D]
        views.append((keys[0], values[0]))
    return views, window, table


class RaggedFullLayer(_RaggedKV, DynamicLayer):
    def __init__(self, layer_idx: int, pack: Pack) -> None:
        DynamicLayer.__init__(self)
        self.layer_idx = layer_idx  # decoder layer this stands for
        self.pack = pack  # the forward's runs


class RaggedSlidingLayer(_RaggedKV, DynamicSlidingWindowLayer):
    def __init__(self, layer_idx: int, pack: Pack, window: int) -> None:
        DynamicSlidingWindowLayer.__init__(self, sliding_window=window)
        self.layer_idx = layer_idx
        self.pack = pack


class RaggedHybridLayer(_RaggedKV, LinearAttentionAndFullAttentionLayer):
    """A hybrid layer of a stacked forward: attention routed per run, recurrent states stacked by the caller."""

    def __init__(self, layer_idx: int, pack: Pack, number_of_states: int) -> None:
        LinearAttentionAndFullAttentionLayer.__init__(self, number_of_states=number_of_states)
        self.layer_idx = layer_idx
        self.pack = pack


class RaggedHybridSlidingLayer(_RaggedKV, LinearAttentionAndSlidingWindowAttentionLayer):
    def __init__(self, layer_idx: int, pack: Pack, window: int, number_of_states: int) -> None:
        LinearAttentionAndSlidingWindowAttentionLayer.__init__(
            self, sliding_window=window, number_of_states=number_of_states
        )
        self.layer_idx = layer_idx
        self.pack = pack


class RaggedCache(Cache):
    """The ``past_key_values`` of a packed forward: one layer per decoder layer, routing K/V per run.

    ``kinds`` is the decoder's layer kinds as the run caches have them: ``"kv"``, ``("rotating", W)`` or
    ``"none"`` for a layer without state.
    """

    def __init__(self, kinds: Sequence[Any], pack: Pack) -> None:
        layers: list[Any] = []
        for i, kind in enumerate(kinds):
            if kind == "kv":
                layers.append(RaggedFullLayer(i, pack))
            elif isinstance(kind, tuple) and kind[0] == "rotating":
                layers.append(RaggedSlidingLayer(i, pack, kind[1]))
            elif kind == "none":
                layers.append(DummyLayer())
            else:
                raise ValueError(f"layer {i}: a packed forward cannot hold a {kind!r} layer")
        super().__init__(layers=layers)


# ==================================================================== attention


def ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: ``query [B, H, S, D]`` -> ``(out [B, S, H, Dv], None)``.

    Inside a pack each slot's queries attend to that slot's K/V views (``key`` and ``value``, the new tokens' K/V,
    matter only for rows :func:`route_kv` reserved for the native kernel); outside one this is SDPA.

    Raises:
        NotImplementedError: attention sinks (``s_aux``), which no served family uses.
    """
    pack = _active[-1] if _active else None
    if pack is None or pack.kv is None:
        if key.dtype != query.dtype:  # rows stored in another dtype (float16 K/V)
            key, value = key.to(query.dtype), value.to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("attention sinks are not supported in packed forwards")
    views, pack.kv = pack.kv, None
    table, pack.table = pack.table, None
    b, h, s, d = query.shape
    first = views[0]
    if isinstance(first, Reserved):  # only reserved with the layer's new K/V at hand
        hk, dv = key.shape[1], value.shape[-1]
    else:
        hk, dv = first[0].shape[0], first[1].shape[-1]
    scale = d**-0.5 if scaling is None else scaling
    softcap = kwargs.get("softcap")
    window = pack.window
    out = query.new_empty((b, s, h, dv))
    scaled = query * scale  # [B, H, S, D]
    done = _native_attention(pack, views, table, scaled, key, value, hk, out, softcap)
    token_queries = token_outputs = None  # per-token views, for one-token slots
    for slot, view, computed in zip(pack.slots, views, done, strict=True):
        if computed:
            continue
        k, v = view
        if k.dtype != query.dtype:  # rows stored in another dtype (float16 K/V): computed in the query's
            k, v = k.to(query.dtype), v.to(query.dtype)
        q = slot.end - slot.start
        if q == 1:  # decoding: every visible row is attended (sliding layers return only the window)
            if token_queries is None:
                token_queries = scaled.transpose(1, 2).flatten(0, 1).unbind(0)  # [H, D] per token
                token_outputs = out.view(b * s, h, dv).unbind(0)
            at = slot.row * s + slot.start
            attend(token_queries[at].unsqueeze(1), k, v, None, softcap, out=token_outputs[at].unsqueeze(1))
            continue
        mask = pack.mask(q, k.shape[-2], window, query.device)  # [q, kv]
        if slot.blocks:
            mask = _with_blocks(mask, slot.blocks)
        target = out[slot.row, slot.start : slot.end].transpose(0, 1)  # [H, q, Dv]
        attend(scaled[slot.row, :, slot.start : slot.end], k, v, mask, softcap, out=target)
    return out, None


def _with_blocks(causal: torch.Tensor, blocks: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``causal`` ``[q, kv]`` (its queries the last ``q`` positions, a sliding window already applied) with each
    block's queries also seeing the block's tokens ahead of them: what transformers builds for Gemma 3, OR(causal,
    block) AND the window, whose bound only limits how far back a query sees."""
    q, kv = causal.shape
    mask = causal.clone()
    for a, b in blocks:
        ahead = torch.ones(b - a, b - a, dtype=torch.bool, device=mask.device).triu(1)  # [i, j]: j after i
        mask[a:b, kv - q + a : kv - q + b] |= ahead  # behind stays as the causal mask (and window) has it
    return mask


def _native_attention(
    pack: Pack,
    views: Sequence[Any],
    table: native.AttentionTable | None,
    scaled: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    hk: int,
    out: torch.Tensor,
    softcap: float | None,
) -> list[bool]:
    """Compute in one native call (:func:`chat.models.kernels.native.kernels`) the attention of every slot it can take:
    the :class:`Reserved` one-token slots, whose rows ``table`` already holds (the kernel first writes their K/V from
    ``key`` / ``value``, ``[B, Hk, S, D]``), and slots whose views are float32 or float16 with contiguous rows, added
    to it here. Writes into ``out``; returns which slots it computed."""
    done = [False] * len(pack.slots)
    kernels = native.kernels()
    if kernels is None or scaled.dtype != torch.float32:
        if table is not None:
            raise RuntimeError("K/V rows were reserved for the native kernels, which are off now")
        return done
    b, h, s, d = scaled.shape
    picked = []
    for i, (slot, view) in enumerate(zip(pack.slots, views, strict=True)):
        if isinstance(view, Reserved):
            picked.append(i)
            continue
        if slot.blocks:  # the kernel's masks are causal: torch computes these
            continue
        k, v = view
        if k.dtype not in native.KV_DTYPES or v.dtype != k.dtype or k.stride(-1) != 1 or v.stride(-1) != 1:
            continue
        if table is None:
            table = native.AttentionTable(len(pack.slots))
        table.add_views(k, v, queries=slot.end - slot.start, first=slot.row * s + slot.start)
        picked.append(i)
    if table is None:
        return done
    new_heads = (key.stride(1), value.stride(1)) if key is not None and value is not None else (0, 0)
    tokens = scaled.transpose(1, 2).reshape(b * s, h, d).contiguous()  # [B*S, H, D]: a copy unless B*S == 1
    kernels.attention(tokens, hk, table, pack.window, new_heads, out.view(b * s, h, out.shape[-1]), softcap)
    for i in picked:
        done[i] = True
    return done


def register() -> None:
    """Register :func:`ragged_attention` with transformers (idempotent)."""
    if RAGGED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(RAGGED_ATTENTION, ragged_attention)
