"""chat.models.hf.run_cache: how a model's layers map onto cache slots, the transformers cache a run feeds (its
attention parts in copy-on-write rows), and the recurrent states taken and put back. The layouts come from the tiny
models' configs (no weights); the states from tiny-lfm2 (short convolutions beside attention)."""

from __future__ import annotations

import pytest
import torch

from chat.models.hf.run_cache import (
    BufferedFullLayer,
    BufferedHybridLayer,
    BufferedSlidingLayer,
    CacheLayout,
    CacheSlot,
)
from chat.models.tiny.text import WINDOW, tiny_config
from tests.chat.models.helpers import random_tokens, tiny

torch.set_num_threads(1)

SPECIAL = {"bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0}
MARGIN = 5


def layout(name: str, **kwargs) -> CacheLayout:
    return CacheLayout(tiny_config(name, 384, SPECIAL), max_rows=100, margin=MARGIN, **kwargs)


def test_attention_and_recurrent_layers_map_onto_slots():
    lfm2 = layout("lfm2")  # conv, full_attention, conv, full_attention
    assert lfm2.slots == (
        CacheSlot(0, "recurrent", None),
        CacheSlot(1, "kv", None),
        CacheSlot(2, "recurrent", None),
        CacheSlot(3, "kv", None),
    )
    assert lfm2.has_recurrent
    gemma3 = layout("gemma3")  # sliding, full, sliding, full
    assert [(s.kind, s.window) for s in gemma3.slots] == [("rotating", WINDOW), ("kv", None)] * 2
    assert not gemma3.has_recurrent
    assert gemma3.layer_parts() == [(("rotating",), WINDOW), (("kv",), None)] * 2
    zamba2 = layout("zamba2")  # mamba, hybrid (attention beside a recurrent part) ...
    assert zamba2.layer_parts()[1] == (("kv", "recurrent"), None)
    assert [s.layer for s in zamba2.slots].count(1) == 2  # one layer, two slots


def test_a_fresh_cache_holds_rows_per_attention_layer():
    gemma3 = layout("gemma3", kv_dtype=torch.float16)
    cache = gemma3.new_cache()
    sliding, full = cache.layers[0], cache.layers[1]
    assert isinstance(sliding, BufferedSlidingLayer) and isinstance(full, BufferedFullLayer)
    assert sliding.rows.window == WINDOW and sliding.rows.keep == WINDOW - 1 + MARGIN
    assert full.rows.window is None and full.rows.max_rows == 100
    assert full.rows.dtype == torch.float16
    assert cache.layers[2].rows is not sliding.rows  # every layer its own rows
    assert isinstance(layout("zamba2").new_cache().layers[1], BufferedHybridLayer)


def test_a_buffered_layer_appends_into_its_rows_and_is_never_cropped():
    layer = layout("llama").new_cache().layers[0]
    k, v = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    keys, values = layer.update(k, v)
    assert torch.equal(keys, k) and torch.equal(values, v)
    more_k, more_v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
    keys, _ = layer.update(more_k, more_v)
    assert torch.equal(keys, torch.cat([k, more_k], dim=2))
    assert layer.get_seq_length() == 4 == layer.rows.seen
    with pytest.raises(NotImplementedError, match="never cropped"):
        layer.crop(1)


def test_rows_stored_in_another_dtype_are_read_back_in_the_computed_one():
    layer = layout("llama", kv_dtype=torch.float16).new_cache().layers[0]
    keys, values = layer.update(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16))
    assert keys.dtype == values.dtype == torch.float32 and layer.rows.keys.dtype == torch.float16


@pytest.fixture(scope="module")
def lfm2_states():
    """tiny-lfm2's layout (its recurrent states learnt) and a run of a few tokens."""
    model = tiny("tiny-lfm2")
    run = model.new_run()
    model.forward(run, random_tokens(model, 5, seed=1))
    yield model._layout, run.state
    model.close_run(run)


def test_taken_states_are_copies_in_layout_order(lfm2_states):
    lfm2, cache = lfm2_states
    layer = lfm2.slots[0].layer
    assert lfm2.recurrent[layer].states == (("conv", 0),)  # a short convolution: one conv state
    (taken,) = lfm2.take_state(cache, layer)
    own = cache.layers[layer].conv_states[0]
    assert torch.equal(taken, own) and taken.data_ptr() != own.data_ptr()


def test_put_states_serve_one_run_and_are_counted(lfm2_states):
    lfm2, cache = lfm2_states
    layer = lfm2.slots[0].layer
    given = lfm2.take_state(cache, layer)
    first, second = lfm2.new_cache(), lfm2.new_cache()
    lfm2.put_state(first, layer, given)
    assert first.layers[layer].conv_states[0] is given[0]  # a lease's private copy, adopted
    lfm2.put_state(second, layer, given)  # the same copies again (a lease restored twice): cloned first
    installed = second.layers[layer].conv_states[0]
    assert installed is not given[0] and torch.equal(installed, given[0])
    with pytest.raises(ValueError, match="expected 1 recurrent tensors, got 2"):
        lfm2.put_state(lfm2.new_cache(), layer, given * 2)
