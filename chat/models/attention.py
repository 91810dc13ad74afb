"""The step batch of :mod:`chat.models.decoder.model` and its attention kernels, called by name (:data:`KERNELS`).

A step's sequences lie end to end in one row of ``T`` tokens (:class:`StepBatch`; the layout and a decode step walked
through are in :mod:`chat.models.decoder.model`'s docstring). A kernel takes one layer's ``q`` ``[T, H, D]`` (already
rotated and scaled), ``k`` and ``v`` ``[T, Hk, D]``, appends each sequence's new K/V to that sequence's rows of the
layer (:class:`chat.models.kv_rows.AttentionRows`, copy-on-write buffers the prefix cache holds views of), and
returns ``[T, H, D]``: each query token attending to its own sequence's rows up to itself (and, in a sliding layer,
its window: a query sees itself and ``W - 1`` positions before it).

- ``"native"`` (:func:`native_attention`): one call of turncache's C kernel (:mod:`chat.models.kernels.native`) per
  layer for every sequence. A decode token's row is only reserved; the kernel writes its K/V there. Each query token is
  computed the same way in any call, so a position's result does not depend on how its prompt was chunked or
  batched. CPU, float32 activations, K/V rows in float32 or float16.
- ``"torch"`` (:func:`torch_attention`): torch operations per sequence (a grouped matmul for a decode token,
  matmuls with a mask for short chunks, SDPA for long ones), on any device and K/V dtype. Exact to rounding, but the
  last bits of a position may differ from one chunking to another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from chat.models.kernels import native
from chat.models.kv_rows import AttentionRows

MATMUL_QUERY = 16  # longest query chunk attend() computes as matmuls; longer ones go to SDPA with a mask


class StepBatchError(ValueError):
    """A step batch whose parts disagree (sequences that do not tile the tokens, ``keep`` out of range, ...)."""


@dataclass(frozen=True, slots=True)
class SeqSlice:
    """One sequence of a step."""

    start: int  # its first token in the step's T tokens
    end: int  # one past its last
    position: int  # the position of its first token (what its rows held before the step)
    rows: Sequence[AttentionRows]  # its K/V rows, one per decoder layer


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Every sequence's new tokens for one forward, end to end (see :mod:`chat.models.decoder.model`)."""

    tokens: torch.Tensor  # [T] int64 token ids
    positions: torch.Tensor  # [T] int64: token i of seqs[s] is at position seqs[s].position + i
    seqs: tuple[SeqSlice, ...]  # in token order, tiling [0, T)
    keep: torch.Tensor  # [K] int64: the tokens whose logits are wanted, in output order


def step_batch(
    pieces: Sequence[tuple[Sequence[int], int, Sequence[AttentionRows], int]], device: torch.device
) -> StepBatch:
    """The step of ``pieces`` ``(token ids, position of the first, the sequence's rows, logits wanted for its last
    n tokens)``, in that order.

    Raises:
        StepBatchError: no pieces, a piece without tokens or asking for more logits than it has tokens, a position
            that is not where its rows are, or pieces whose rows are not all of one depth.
    """
    if not pieces:
        raise StepBatchError("a step needs at least one sequence")
    ids: list[int] = []
    positions: list[int] = []
    keep: list[int] = []
    seqs = []
    depth = len(pieces[0][2])
    for tokens, position, rows, logits in pieces:
        n = len(tokens)
        if n == 0 or not 0 <= logits <= n or len(rows) != depth or position < 0:
            raise StepBatchError(f"bad piece: {n} tokens, {logits} logits, position {position}, {len(rows)} layers")
        if any(r.seen != position for r in rows):
            raise StepBatchError(f"a sequence at position {position} whose rows hold {[r.seen for r in rows][:3]}...")
        start = len(ids)
        ids.extend(tokens)
        positions.extend(range(position, position + n))
        keep.extend(range(start + n - logits, start + n))
        seqs.append(SeqSlice(start, start + n, position, rows))
    return StepBatch(
        tokens=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        seqs=tuple(seqs),
        keep=torch.tensor(keep, dtype=torch.long, device=device),
    )


Kernel = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, StepBatch, "int | None", "float | None"], Any]


def native_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    step: StepBatch,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """The ``"native"`` kernel (see the module docstring): one :meth:`chat.models.kernels.native.Kernels.attention`
    call.

    Raises:
        RuntimeError: the native kernels cannot be had (the caller picks ``"torch"`` then).
        chat.models.kernels.native.AttentionRowError: a row the kernel must not read (never reaches C).
    """
    kernels = native.kernels()
    if kernels is None:
        raise RuntimeError("the native attention kernel is not available")
    t, heads, _ = q.shape
    kv_heads = k.shape[1]
    table = native.AttentionTable(len(step.seqs))
    like: tuple[torch.Tensor, torch.Tensor] | None = None  # one token's K/V [1, Hk, 1, D]: shapes for a new buffer
    k_at, k_token = k.data_ptr(), k.stride(0) * k.element_size()
    v_at, v_token = v.data_ptr(), v.stride(0) * v.element_size()
    for seq in step.seqs:
        rows = seq.rows[layer]
        n = seq.end - seq.start
        if n == 1:  # a decode token: its row is reserved, the kernel writes its K/V
            if like is None:
                like = k[:1].transpose(0, 1).unsqueeze(0), v[:1].transpose(0, 1).unsqueeze(0)
            rows.reserve_row(
                table,
                *like,
                first=seq.start,
                new_key=k_at + seq.start * k_token,
                new_value=v_at + seq.start * v_token,
            )
            continue
        keys, values = rows.append(_heads_first(k[seq.start : seq.end]), _heads_first(v[seq.start : seq.end]))
        table.add_views(keys[0], values[0], queries=n, first=seq.start)
    out = q.new_empty((t, heads, v.shape[-1]))
    kernels.attention(q.contiguous(), kv_heads, table, window, (k.stride(1), v.stride(1)), out, softcap)
    return out


def torch_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    step: StepBatch,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """The ``"torch"`` kernel (see the module docstring): per sequence, on ``q``'s device (:func:`attend`)."""
    t, heads, _ = q.shape
    out = q.new_empty((t, heads, v.shape[-1]))
    for seq in step.seqs:
        rows = seq.rows[layer]
        n = seq.end - seq.start
        if n == 1:
            keys, values = rows.append_token(k[seq.start], v[seq.start])  # [Hk, kv, D]
        else:
            keys4, values4 = rows.append(_heads_first(k[seq.start : seq.end]), _heads_first(v[seq.start : seq.end]))
            keys, values = keys4[0], values4[0]
        if keys.dtype != q.dtype:  # rows stored in another dtype (float16 / bfloat16 K/V): computed in q's
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        mask = None if n == 1 else causal_mask(n, keys.shape[1], window, q.device)
        target = out[seq.start : seq.end].transpose(0, 1)  # [H, n, Dv]
        attend(q[seq.start : seq.end].transpose(0, 1), keys, values, mask, softcap, out=target)
    return out


def attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    softcap: float | None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence's attention in torch operations: the one body both forwards use (the own decoder's ``"torch"``
    kernel, and :func:`chat.models.hf.ragged.ragged_attention` on transformers' forward).

    ``queries`` ``[H, n, D]``, already scaled; ``keys`` ``[Hk, kv, D]`` and ``values`` ``[Hk, kv, Dv]`` in the
    queries' dtype (``H`` a multiple of ``Hk``: query head ``h`` reads K/V head ``h // (H / Hk)``); ``mask`` boolean
    ``[n, kv]`` (True: attend), None for a decoding token (``n`` 1), which sees every row it is given (a sliding
    layer gives only its window). A decoding token is a grouped matmul, a chunk of at most :data:`MATMUL_QUERY`
    tokens (or any chunk with ``softcap``) matmuls with the mask, a longer one SDPA. Written into ``out``
    (``[H, n, Dv]``, a view of the caller's output) when given; returns ``[H, n, Dv]``."""
    heads, n, d = queries.shape
    kv_heads, kv, dv = keys.shape[0], keys.shape[1], values.shape[-1]
    group = heads // kv_heads
    if n == 1:
        scores = torch.bmm(queries.reshape(kv_heads, group, d), keys.transpose(1, 2))  # [Hk, g, kv]
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        target = out.view(kv_heads, group, dv) if out is not None else None
        return torch.bmm(torch.softmax(scores, dim=-1), values, out=target).view(heads, 1, dv)
    assert mask is not None
    if n <= MATMUL_QUERY or softcap:
        scores = torch.bmm(queries.reshape(kv_heads, group * n, d), keys.transpose(1, 2)).view(kv_heads, group, n, kv)
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        scores.masked_fill_(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(kv_heads, group * n, kv)
        o = torch.bmm(probs, values).view(heads, n, dv)
    else:
        o = F.scaled_dot_product_attention(
            queries[None], keys[None], values[None], attn_mask=mask, scale=1.0, enable_gqa=group > 1
        )[0]
    if out is None:
        return o
    out.copy_(o)
    return out


KERNELS: dict[str, Kernel] = {"native": native_attention, "torch": torch_attention}


def kernel_for(device: torch.device, kv_dtype: torch.dtype) -> str:
    """``"native"`` where its kernel runs (CPU, the library loaded, K/V rows it reads), else ``"torch"``."""
    if device.type == "cpu" and kv_dtype in native.KV_DTYPES and native.kernels() is not None:
        return "native"
    return "torch"


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[n, Hk, D]`` -> ``[1, Hk, n, D]`` (a view), the layout of :class:`AttentionRows`."""
    return x.transpose(0, 1).unsqueeze(0)


def causal_mask(q: int, kv: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Boolean ``[q, kv]`` (True = attend): the last ``q`` of ``kv`` positions are the queries; each sees itself and
    what precedes it, within ``window`` positions if one is given."""
    own = torch.arange(q, device=device).unsqueeze(1) + (kv - q)  # [q, 1]
    cols = torch.arange(kv, device=device).unsqueeze(0)  # [1, kv]
    mask = cols <= own
    if window is not None:
        mask &= cols > own - window
    return mask
