"""cache.layers: what each kind of layer state accepts when built, the lengths it can be restored at, and what
restoring gives (views of attention rows, a private copy of recurrent state)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cache import LayoutError, LengthError, NormalKV, RecurrentSnapshot, RecurrentState, RotatingKV, Stateless
from cache.layers import attention_dtype, layer_length, moved, restore, signature, tensors_of
from tests.cache.helpers import normal, recurrent, rotating


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: RotatingKV(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 4, -1), LengthError),
        (lambda: RotatingKV(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 0, 5), LengthError),
        (lambda: RotatingKV(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 8, 10), LengthError),
        (lambda: RotatingKV(torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2), 4, 5), LengthError),
        (lambda: RecurrentState({-3: (torch.zeros(1),)}), LengthError),
        (lambda: RecurrentState({}), LengthError),
        (lambda: RecurrentState({2: (torch.zeros(1),), 3: (torch.zeros(2),)}), LayoutError),
        (lambda: NormalKV(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 3, 2)), LayoutError),
        (lambda: NormalKV(torch.zeros(4), torch.zeros(4)), LayoutError),
    ],
)
def test_bad_layer_states_are_refused_when_built(build, error):
    with pytest.raises(error):
        build()


@given(st.integers(1, 40), st.integers(1, 8), st.integers(0, 6), st.data())
def test_a_rotating_layer_restores_the_window_before_each_length_it_can_serve(seen, window, margin, data):
    rows = min(seen, window - 1 + margin)
    state = rotating(seen, window, rows)
    lo = state.shortest()
    assert lo == (0 if rows == seen else seen - rows + window - 1)
    n = data.draw(st.integers(max(lo, 1), seen), label="n")
    back = restore(state, n)
    assert isinstance(back, RotatingKV) and (back.seen, back.window) == (n, window)
    positions = back.keys[0, 0, :, 0].tolist()  # helpers.rotating writes each row's position into it
    assert positions == list(range(max(0, n - window + 1), n))
    assert back.keys.untyped_storage().data_ptr() == state.keys.untyped_storage().data_ptr()  # a view


def test_a_normal_layer_restores_a_view_of_its_first_rows():
    state = normal(6)
    back = restore(state, 4)
    assert isinstance(back, NormalKV) and back.length == 4 and torch.equal(back.keys, state.keys[..., :4, :])
    assert back.values.untyped_storage().data_ptr() == state.values.untyped_storage().data_ptr()


def test_recurrent_state_restores_a_private_copy_of_the_snapshot_at_that_length():
    state = recurrent({3, 7})
    back = restore(state, 3)
    assert isinstance(back, RecurrentSnapshot) and back.length == 3 and back.tensors[0].eq(3.0).all()
    back.tensors[0].add_(1.0)  # models update recurrent state in place
    assert state.snapshots[3][0].eq(3.0).all()
    with pytest.raises(TypeError):
        state.snapshots[9] = (torch.zeros(1, 3),)  # the snapshots are read-only once built


def test_lengths_signatures_and_dtypes_of_each_kind():
    assert [layer_length(s) for s in (normal(5), rotating(9, 4), recurrent({2, 8}), Stateless())] == [5, 9, 8, None]
    as_double = NormalKV(*(t.double() for t in tensors_of(normal(5))))
    assert signature(normal(5)) == signature(normal(9)) != signature(as_double)
    assert signature(rotating(9, 4)) == signature(rotating(12, 4)) != signature(rotating(9, 5))
    assert signature(recurrent({2})) == signature(recurrent({5, 6})) != signature(recurrent({2}, width=4))
    assert signature(Stateless()) == ("stateless",)
    assert attention_dtype(rotating(9, 4)) == torch.float32 and attention_dtype(recurrent({2})) is None
    with pytest.raises(LayoutError):
        signature(torch.zeros(1))  # type: ignore[arg-type]


def test_a_move_passes_every_tensor_through_and_keeps_the_rest():
    for state in (normal(5), rotating(9, 4), recurrent({2, 8}), Stateless()):
        out = moved(state, lambda t: t * 2)
        assert type(out) is type(state) and layer_length(out) == layer_length(state)
        assert all(torch.equal(a, b * 2) for a, b in zip(tensors_of(out), tensors_of(state), strict=True))
    assert moved(rotating(9, 4), lambda t: t).window == 4
    assert isinstance(moved(recurrent({2}), lambda t: t), RecurrentState)
