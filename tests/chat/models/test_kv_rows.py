"""The copy-on-write row buffers on their own (no model): where rows go, when they are copied, what is exported."""

from __future__ import annotations

import pytest
import torch

from cache import NormalKV, RotatingKV
from chat.models.kernels import native
from chat.models.kv_rows import AttentionRows, locate


def kv(start: int, n: int, heads: int = 2, dim: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V [1, heads, n, dim] whose every entry is its position (values negated), so rows can be checked."""
    pos = torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1).expand(1, heads, n, dim)
    return pos.clone(), -pos.clone()


def positions(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t[0, 0, :, 0].tolist()]


def test_full_rows_grow_in_place_and_return_every_position():
    rows = AttentionRows(None, 0, max_rows=10_000)
    k, v = rows.append(*kv(0, 5))
    assert positions(k) == list(range(5)) and positions(-v) == list(range(5))
    base = rows.keys
    for p in range(5, 40):
        k, _ = rows.append(*kv(p, 1))
    assert rows.keys is base and rows.copies == 0
    assert positions(k) == list(range(40))
    assert rows.mask_sizes(3) == (43, 0)


def test_full_rows_grow_by_copying_when_full_and_old_views_stay_valid():
    rows = AttentionRows(None, 0, max_rows=10_000)
    rows.append(*kv(0, 250))
    early = rows.export()
    capacity = rows.keys.shape[-2]
    rows.append(*kv(250, capacity))  # outgrows the first buffer
    assert rows.copies == 1
    assert positions(rows.export().keys) == list(range(250 + capacity))
    assert positions(early.keys) == list(range(250))


def test_export_views_are_located_and_adopted_at_the_tip():
    a = AttentionRows(None, 0, max_rows=10_000)
    a.append(*kv(0, 10))
    state = a.export()
    found = locate(state.keys, state.values)
    assert found is not None and found[3] == 0 and found[2].filled == 10
    b = AttentionRows(None, 0, max_rows=10_000)
    b.restore(state)
    assert b.at_tip()
    b.append(*kv(10, 2))
    assert b.copies == 0 and b.keys is a.keys  # same buffer, appended in place
    c = AttentionRows(None, 0, max_rows=10_000)
    c.restore(state)
    assert not c.at_tip()  # b moved the tip past it
    k, _ = c.append(*kv(10, 1))
    assert c.copies == 1 and positions(k) == list(range(11))
    assert positions(state.keys) == list(range(10))


def test_prefix_views_and_foreign_tensors_are_copied_on_append():
    a = AttentionRows(None, 0, max_rows=10_000)
    a.append(*kv(0, 10))
    full = a.export()
    prefix = NormalKV(full.keys[..., :6, :], full.values[..., :6, :])
    for state in (prefix, NormalKV(*kv(0, 6))):  # a view below the tip; a tensor that is none of ours
        b = AttentionRows(None, 0, max_rows=10_000)
        b.restore(state)
        assert b.seen == 6 and not b.at_tip()
        k, _ = b.append(*kv(6, 2))
        assert b.copies == 1 and positions(k) == list(range(8))
    assert positions(full.keys) == list(range(10))


def test_sliding_rows_show_the_window_and_keep_the_margin():
    window, keep = 4, 3 + 5
    rows = AttentionRows(window, keep, max_rows=10_000)
    k, _ = rows.append(*kv(0, 2))
    assert positions(k) == [0, 1]
    assert rows.mask_sizes(1) == (3, 0)
    for p in range(2, 600):
        offset_before = rows.mask_sizes(1)
        k, _ = rows.append(*kv(p, 1))
        assert positions(k) == list(range(max(0, p - window + 1), p + 1))
        assert offset_before == (len(positions(k)), max(0, p - window + 1))
    state = rows.export()
    assert isinstance(state, RotatingKV) and state.seen == 600 and positions(state.keys) == list(range(592, 600))
    assert rows.copies >= 1  # the buffer was compacted along the way
    k, _ = rows.append(*kv(600, 10))  # a chunk longer than the window sees the window before it
    assert positions(k) == list(range(597, 610))


def test_sliding_restore_of_a_rewound_view():
    a = AttentionRows(4, 8, max_rows=10_000)
    a.append(*kv(0, 30))
    state = a.export()  # rows for 22..29
    rewound = RotatingKV(state.keys[..., :5, :], state.values[..., :5, :], 4, 27)  # rows 22..26, as cache.restore
    b = AttentionRows(4, 8, max_rows=10_000)
    b.restore(rewound)
    k, _ = b.append(*kv(27, 1))
    assert positions(k) == [24, 25, 26, 27] and b.copies == 1


def test_restore_refuses_the_wrong_kind():
    with pytest.raises(TypeError):
        AttentionRows(None, 0, 100).restore(RotatingKV(*kv(0, 3), window=4, seen=3))
    with pytest.raises(TypeError):
        AttentionRows(4, 3, 100).restore(NormalKV(*kv(0, 3)))


@pytest.mark.parametrize("window", [None, 4])
def test_a_reserved_row_is_reserve_token_and_layout_in_one_call(window):
    """Two runs side by side, one reserving through reserve_row (the native kernel's row), the other through
    reserve_token + layout: the same rows, the same description, at the tip, when the buffer fills up, and after a
    restore elsewhere."""
    fast, slow = AttentionRows(window, 6, max_rows=10_000), AttentionRows(window, 6, max_rows=10_000)
    like = kv(0, 1)
    for rows in (fast, slow):
        rows.append(*kv(0, 3))
    shared = fast.export()
    for step in range(600):  # past the first buffer's capacity (a reallocation on the way)
        if step == 300:  # a run restored from a shared entry: its first reservation copies
            for rows in (fast, slow):
                rows.restore(shared)
        table = native.AttentionTable()
        fast.reserve_row(table, *like, first=step % 3, new_key=64, new_value=128)
        got = table[0]
        row, lo = slow.reserve_token(*like)  # the same row numbers, each in its own buffer
        k_at, k_heads, k_rows, v_at, v_heads, v_rows = fast.layout()
        want = (k_at + lo * k_rows * 4, k_heads, k_rows, v_at + lo * v_rows * 4, v_heads, v_rows, row - lo + 1)
        assert tuple(getattr(got, f) for f in native.ROW_FIELDS[:7]) == want and slow.layout()[1:3] == (k_heads, k_rows)
        assert (got.new_key, got.new_value, got.queries, got.first, got.half) == (64, 128, 1, step % 3, 0)
        assert (fast.seen, fast.mark.filled, fast.held) == (slow.seen, slow.mark.filled, slow.held)
        for rows in (fast, slow):  # the caller writes the reserved row
            rows.keys[0, :, rows.row0 + rows.held - 1] = float(rows.seen - 1)
    assert fast.copies == slow.copies >= 2
