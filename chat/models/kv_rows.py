"""Preallocated, copy-on-write K/V rows for one attention layer of one run (pure torch, no transformers).

A *buffer* is a pair of base tensors ``keys [B, H, capacity, Dk]`` and ``values [B, H, capacity, Dv]`` plus a
:class:`_Mark` whose ``filled`` says how many rows have been written. The one rule that makes sharing safe:

    rows below ``filled`` are never written again

(:meth:`AttentionRows.drop_last` lowers ``filled`` only over rows its run appended since it last exported, which no
one else has seen).

Cache entries hold views of rows below ``filled`` (what :meth:`AttentionRows.export` returns), so they never change.
A run appends in place only while it sits at the tip of its buffer (its last row is row ``filled - 1``) and the
buffer has room; otherwise it first copies the rows it still needs into a fresh buffer of its own. Hence:

- restoring is free: a run adopts the lease's views by reference (:meth:`AttentionRows.restore` never copies);
- a run restored at exactly the length that an earlier run exported, with nobody having written past it since,
  appends in place into the same buffer (the common case: the next turn of a conversation);
- two runs restored from one entry: the first to append takes the tip, the second copies at its first append.

Views keep their base tensor alive (``view._base``), and the mark is an attribute of that base, so a run can tell
a view of one of our buffers (and where it sits) from any other tensor. Buffers are allocated outside inference
mode for that reason: views of inference tensors do not record their base.

Full attention (``window=None``): position ``p`` sits at row ``row0 + p``. Sliding window ``W``: the run holds
positions ``[first, seen)``; when it must reallocate it keeps only the last ``keep`` (= ``W - 1`` + a margin) rows.
Not thread-safe: one thread drives all runs of a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cache import NormalKV, RotatingKV
from chat.models.errors import RunStateError
from chat.models.kernels import native

ROW_ALIGN = 256  # buffer capacities are multiples of this
_MARK_ATTR = "_turncache_mark"


class _Mark:
    """Shared by the two base tensors of one buffer."""

    __slots__ = ("filled",)

    def __init__(self, filled: int) -> None:
        self.filled = filled  # rows [0, filled) are written and immutable


def _round_up(n: int, to: int = ROW_ALIGN) -> int:
    return -(-n // to) * to


def _alloc(
    like_k: torch.Tensor, like_v: torch.Tensor, capacity: int, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, _Mark]:
    """A new buffer shaped like ``like_k`` / ``like_v`` with ``capacity`` rows, nothing written yet; of ``dtype``, or
    of theirs when None."""
    with torch.inference_mode(False):  # so that views record their base (see module docstring)
        k_dtype, v_dtype = dtype or like_k.dtype, dtype or like_v.dtype
        keys = torch.empty((*like_k.shape[:-2], capacity, like_k.shape[-1]), dtype=k_dtype, device=like_k.device)
        values = torch.empty((*like_v.shape[:-2], capacity, like_v.shape[-1]), dtype=v_dtype, device=like_v.device)
    mark = _Mark(0)
    setattr(keys, _MARK_ATTR, mark)
    setattr(values, _MARK_ATTR, mark)
    return keys, values, mark


def _row_of(view: torch.Tensor, base: torch.Tensor) -> int | None:
    """The row of ``base`` where ``view`` starts, if ``view`` is a whole-row range of ``base``."""
    if view.stride() != base.stride() or view.shape[:-2] != base.shape[:-2] or view.shape[-1] != base.shape[-1]:
        return None
    delta = view.storage_offset() - base.storage_offset()
    step = base.stride(-2)
    if step <= 0 or delta < 0 or delta % step:
        return None
    row = delta // step
    return row if row + view.shape[-2] <= base.shape[-2] else None


def locate(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, _Mark, int] | None:
    """``(base_keys, base_values, mark, row)`` if the views lie at the same rows of one of our buffers, else None."""
    base_k, base_v = keys._base, values._base
    if base_k is None or base_v is None:
        return None
    mark = getattr(base_k, _MARK_ATTR, None)
    if mark is None or getattr(base_v, _MARK_ATTR, None) is not mark:
        return None
    row = _row_of(keys, base_k)
    if row is None or _row_of(values, base_v) != row:
        return None
    return base_k, base_v, mark, row


class AttentionRows:
    """One run's K/V for one attention layer: positions ``[first, seen)`` at rows ``[row0, row0 + held)``."""

    def __init__(self, window: int | None, keep: int, max_rows: int, dtype: torch.dtype | None = None) -> None:
        if window is not None and keep < window - 1:
            raise ValueError(f"keep ({keep}) must be at least window - 1 ({window - 1})")
        self.window = window  # None: full attention; W: a query sees itself and the W - 1 positions before it
        self.keep = keep  # sliding only: rows exported, and kept when reallocating (W - 1 + margin)
        self.max_rows = max_rows  # full only: capacity is not grown past this (the context window) unless needed
        self.dtype = dtype  # what the rows are stored in (appends convert, as copy_ does); None: the K/V's own
        self.keys: torch.Tensor | None = None  # base tensor [B, H, capacity, Dk], or a foreign view (mark None)
        self.values: torch.Tensor | None = None  # base tensor [B, H, capacity, Dv], same rows as keys
        self.mark: _Mark | None = None  # the buffer's mark; None while holding foreign views
        self.row0 = 0  # row of position `first`
        self.first = 0  # oldest position held
        self.seen = 0  # positions absorbed (the layer's length)
        self.floor = 0  # positions below this were restored or exported: others may hold views of their rows
        self.copies = 0  # reallocations (with a copy of held rows) so far, for tests and benchmarks
        self._layout: tuple[torch.Tensor, tuple[int, ...], int, int | None] | None = None  # (keys, layout(),
        # element size, native.KV_DTYPES of the rows' dtype)

    @property
    def held(self) -> int:
        return self.seen - self.first

    def at_tip(self) -> bool:
        """True when appending in place cannot touch a row that anyone else may see."""
        return self.mark is not None and self.mark.filled == self.row0 + self.held

    # ---------------------------------------------------------------- the model's side

    def mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` of what :meth:`append` will return for ``query_length`` new tokens."""
        if self.window is None:
            return self.seen + query_length, 0
        visible = min(self.seen, self.window - 1)
        return visible + query_length, self.seen - visible

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Absorb new K/V ``[B, H, q, D]``; return what attention must see, as views ``[B, H, kv_length, D]``."""
        q = keys.shape[-2]
        visible = self.seen if self.window is None else min(self.seen, self.window - 1)
        if self.keys is None or not self.at_tip() or self.row0 + self.held + q > self.keys.shape[-2]:
            self._reallocate(keys, values, q)
        assert self.keys is not None and self.values is not None and self.mark is not None
        end = self.row0 + self.held
        self.keys[..., end : end + q, :].copy_(keys)
        self.values[..., end : end + q, :].copy_(values)
        self.mark.filled = end + q
        self.seen += q
        lo = end - visible
        return self.keys[..., lo : end + q, :], self.values[..., lo : end + q, :]

    def append_token(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`append` for one token given as ``[H, D]`` (a decode step), in fewer tensor operations; returns
        views ``[H, kv_length, D]`` of the run's first (only) batch row."""
        row, lo = self.reserve_token(key[None, :, None], value[None, :, None])
        assert self.keys is not None and self.values is not None
        keys, values = self.keys[0], self.values[0]  # [H, capacity, D]
        keys[:, row].copy_(key)
        values[:, row].copy_(value)
        return keys[:, lo : row + 1], values[:, lo : row + 1]

    def reserve_token(self, like_key: torch.Tensor, like_value: torch.Tensor) -> tuple[int, int]:
        """Count one more token and make room for it in a buffer of this run's own (``like_key`` / ``like_value``,
        ``[1, H, 1, D]``, give the shapes and dtype should a buffer be allocated) without writing it; return
        ``(row, lo)``: the token's K/V go to row ``row`` of :attr:`keys` / :attr:`values` (``[1, H, capacity,
        D]``, contiguous), which the caller must write before anything reads them, and attention sees rows
        ``[lo, row]``. For a caller that writes the rows itself (the native decode kernel)."""
        visible = self.seen if self.window is None else min(self.seen, self.window - 1)
        if self.keys is None or not self.at_tip() or self.row0 + self.held + 1 > self.keys.shape[-2]:
            self._reallocate(like_key, like_value, 1)
        assert self.mark is not None
        row = self.row0 + self.held
        self.mark.filled = row + 1
        self.seen += 1
        return row, row - visible

    def reserve_row(
        self,
        table: native.AttentionTable,
        like_key: torch.Tensor,
        like_value: torch.Tensor,
        *,
        first: int,
        new_key: int,
        new_value: int,
    ) -> None:
        """:meth:`reserve_token`, adding the native attention kernel's row for it to ``table``: the visible rows (the
        new token's row last), its query token at ``first`` of the kernel's call, and where its new K/V lie (float32;
        the kernel copies them into the new row). A decode step makes this call for every run and layer: the common
        case (the run at the tip of its own buffer, with room, described before) makes no other call.

        Raises:
            native.AttentionRowError: the rows' dtype is not one the kernel reads (nothing is reserved then), or the
                row is wrong (see :meth:`native.AttentionTable.add`).
        """
        if native.KV_DTYPES.get(self.dtype or like_key.dtype) is None:
            raise native.AttentionRowError(f"the attention kernel reads float32 or float16 rows, not {like_key.dtype}")
        mark, keys = self.mark, self.keys
        row = self.row0 + self.seen - self.first
        if mark is None or keys is None or mark.filled != row or row >= keys.shape[-2]:
            row, lo = self.reserve_token(like_key, like_value)
        else:
            lo = row - (self.seen if self.window is None else min(self.seen, self.window - 1))
            mark.filled = row + 1
            self.seen += 1
        cached = self._layout
        if cached is None or cached[0] is not self.keys:
            self.layout()
            cached = self._layout
            assert cached is not None
        (k_at, k_heads, k_rows, v_at, v_heads, v_rows), size, half = cached[1], cached[2], cached[3]
        assert half is not None
        table.add(
            k_at + lo * k_rows * size,
            k_heads,
            k_rows,
            v_at + lo * v_rows * size,
            v_heads,
            v_rows,
            row - lo + 1,
            queries=1,
            first=first,
            half=half,
            new_key=new_key,
            new_value=new_value,
        )

    def layout(self) -> tuple[int, int, int, int, int, int]:
        """Where the buffer lies, for native code: ``(keys address, key head stride, key row stride, values
        address, value head stride, value row stride)`` (bytes for addresses, elements for strides) of batch row 0.
        Cached until the buffer changes."""
        assert self.keys is not None and self.values is not None
        cached = self._layout
        if cached is None or cached[0] is not self.keys:
            k, v = self.keys, self.values
            described = (k.data_ptr(), k.stride(-3), k.stride(-2), v.data_ptr(), v.stride(-3), v.stride(-2))
            cached = (k, described, k.element_size(), native.KV_DTYPES.get(k.dtype))
            self._layout = cached
        return cached[1]

    # ---------------------------------------------------------------- the cache's side

    def export(self) -> NormalKV | RotatingKV:
        """Views of the rows at the current length (no copy). Sliding layers give up to ``keep`` rows."""
        if self.keys is None or self.values is None:
            raise ValueError("nothing to export: the layer has absorbed no tokens")
        hi = self.row0 + self.held
        self.floor = self.seen
        if self.window is None:
            return NormalKV(self.keys[..., self.row0 : hi, :], self.values[..., self.row0 : hi, :])
        lo = hi - min(self.held, self.keep)
        return RotatingKV(self.keys[..., lo:hi, :], self.values[..., lo:hi, :], self.window, self.seen)

    def restore(self, state: NormalKV | RotatingKV) -> None:
        """Take over a lease's K/V by reference. Nothing is copied here; :meth:`append` copies if it must."""
        if self.window is None:
            if not isinstance(state, NormalKV):
                raise TypeError(f"a full-attention layer cannot restore a {type(state).__name__}")
            seen = state.length
        else:
            if not isinstance(state, RotatingKV) or state.window != self.window:
                raise TypeError(f"a sliding layer of window {self.window} cannot restore {state!r}")
            seen = state.seen
        rows = state.keys.shape[-2]
        found = locate(state.keys, state.values)
        if found is not None:
            self.keys, self.values, self.mark, self.row0 = found
        else:
            self.keys, self.values, self.mark, self.row0 = state.keys, state.values, None, 0
        self.first = seen - rows
        self.seen = seen
        self.floor = seen

    def drop_last(self, n: int) -> None:
        """Forget the last ``n`` positions (draft tokens that a verification rejected): they must have been appended
        by this run, in place at the tip of its own buffer, since it was restored or last exported, so that no one
        else can hold a view of their rows. The rows are written over by the next append.

        Raises:
            ValueError: ``n`` reaches below :attr:`floor` or the run is not at the tip of its own buffer.
        """
        if n == 0:
            return
        if n < 0 or self.seen - n < max(self.floor, self.first) or not self.at_tip():
            raise ValueError(f"cannot drop {n} of {self.seen} positions (floor {self.floor}, tip {self.at_tip()})")
        assert self.mark is not None
        self.seen -= n
        self.mark.filled -= n

    def checkpoint(self) -> tuple:
        """What :meth:`rollback` needs to undo every :meth:`append` made after this call (a failed forward)."""
        filled = self.mark.filled if self.mark is not None else None
        return (self.keys, self.values, self.mark, filled, self.row0, self.first, self.seen, self.floor)

    def rollback(self, point: tuple) -> None:
        """Forget what was appended since ``point`` (from :meth:`checkpoint`). Rows written in place beyond the old
        tip are unseen by anyone (nothing was exported since) and get written over; a buffer allocated since is
        dropped."""
        self.keys, self.values, self.mark, filled, self.row0, self.first, self.seen, self.floor = point
        if self.mark is not None and filled is not None:
            self.mark.filled = filled

    # ---------------------------------------------------------------- helpers

    def _reallocate(self, keys: torch.Tensor, values: torch.Tensor, q: int) -> None:
        """Move the rows still needed into a fresh buffer with room for ``q`` more rows (and then some)."""
        held = self.held
        if self.window is None:
            take = held
            need = take + q
            capacity = max(need, min(self.max_rows, _round_up(need + max(64, need // 4))))
        else:
            take = min(held, self.keep)
            capacity = _round_up(take + q + max(self.keep, 64))
        new_k, new_v, mark = _alloc(keys, values, capacity, self.dtype)
        if take:
            assert self.keys is not None and self.values is not None
            src = self.row0 + held - take
            new_k[..., :take, :].copy_(self.keys[..., src : src + take, :])
            new_v[..., :take, :].copy_(self.values[..., src : src + take, :])
            self.copies += 1
        mark.filled = take
        self.keys, self.values, self.mark = new_k, new_v, mark
        self.row0 = 0
        self.first = self.seen - take


def drop_last_of_run(layers: Sequence[AttentionRows], n: int, length: int) -> None:
    """Forget the last ``n`` of a run's ``length`` tokens in every layer's rows (:meth:`AttentionRows.drop_last`),
    all or none: each layer is checked first.

    Raises:
        RunStateError: ``n`` is not in ``(0, length]``, or a layer cannot drop that many (below its floor, or not at
            the tip of its own buffer).
    """
    if not 0 < n <= length or any(r.seen - n < max(r.floor, r.first) or not r.at_tip() for r in layers):
        raise RunStateError(f"cannot rewind {n} of the run's {length} tokens")
    for r in layers:
        r.drop_last(n)
