"""Runs restored from one cache entry share its K/V buffers copy-on-write: restoring copies nothing, the first run to
append at the tip does so in place, any other run copies first, and nobody ever changes rows an entry holds."""

from __future__ import annotations

import pytest
import torch

from cache import NormalKV, PrefixCache, RotatingKV
from cache.layers import tensors_of
from chat.tools.testing.baselines import buffer_copies
from tests.chat.models.helpers import TOLERANCE, full_logits, max_diff, namespace, random_tokens, store, tiny

FAMILIES = ["tiny-llama", "tiny-mistral", "tiny-falconh1", "tiny-zamba2"]


def _entry_tensors(model, cache, tokens):
    ns = namespace(model)
    lease = cache.acquire(cache.lookup(ns, [*tokens, 3]), ns)
    tensors = [t for state in lease.layers for t in tensors_of(state)] if lease.layers else []
    cache.release(lease)
    return tensors


@pytest.mark.parametrize("spec", FAMILIES)
def test_two_runs_from_one_entry_do_not_corrupt_each_other_or_the_entry(spec):
    model = tiny(spec)
    prefix = random_tokens(model, 100, seed=1)
    x = random_tokens(model, 30, seed=2)
    y = random_tokens(model, 30, seed=3)
    cache = PrefixCache()
    store(model, cache, prefix)
    before = [t.clone() for t in _entry_tensors(model, cache, prefix)]
    ns = namespace(model)
    match = cache.lookup(ns, [*prefix, *x])
    assert match.length == 100
    lease_b, lease_c = cache.acquire(match, ns), cache.acquire(match, ns)
    b, c = model.new_run(lease_b), model.new_run(lease_c)
    out_b, out_c = [], []
    for i in range(0, 30, 3):  # interleaved: b takes the tip first, c must copy
        out_b.append(model.forward(b, x[i : i + 3]))
        out_c.append(model.forward(c, y[i : i + 1]))
        out_c.append(model.forward(c, y[i + 1 : i + 3]))
    assert max_diff(torch.cat(out_b), full_logits(model, [*prefix, *x])[100:]) <= TOLERANCE
    assert max_diff(torch.cat(out_c), full_logits(model, [*prefix, *y])[100:]) <= TOLERANCE
    after = _entry_tensors(model, cache, prefix)
    assert all(torch.equal(u, v) for u, v in zip(before, after, strict=True)), "an entry's rows were overwritten"
    assert buffer_copies(model, b) == 0  # b sat at the tip with room to spare
    assert buffer_copies(model, c) >= 1
    for run, lease in ((b, lease_b), (c, lease_c)):
        model.close_run(run)
        cache.release(lease)
    z = random_tokens(model, 20, seed=4)  # the entry still serves a third continuation
    lease = cache.acquire(cache.lookup(ns, [*prefix, *z]), ns)
    d = model.new_run(lease)
    assert max_diff(model.forward(d, z), full_logits(model, [*prefix, *z])[100:]) <= TOLERANCE
    model.close_run(d)
    cache.release(lease)


def test_the_next_turn_appends_in_place_into_the_previous_turns_buffer():
    model = tiny("tiny-llama")
    tokens = random_tokens(model, 120, seed=5)
    cache = PrefixCache()
    ns = namespace(model)
    store(model, cache, tokens[:80])
    stored = _entry_tensors(model, cache, tokens[:80])
    lease = cache.acquire(cache.lookup(ns, tokens), ns)
    run = model.new_run(lease)
    model.forward(run, tokens[80:])
    assert buffer_copies(model, run) == 0
    exported = model.export(run)
    first = next(s for s in exported if isinstance(s, NormalKV))
    assert first.keys.untyped_storage().data_ptr() == stored[0].untyped_storage().data_ptr()  # same buffer
    cache.insert(ns, tokens, exported)
    model.close_run(run)
    cache.release(lease)
    cache.check_invariants()
    assert cache.stats().entries == 1  # the longer entry superseded the shorter: one buffer, one entry


def test_a_rewound_run_copies_before_appending():
    model = tiny("tiny-llama")
    tokens = random_tokens(model, 120, seed=6)
    cache = PrefixCache()
    ns = namespace(model)
    store(model, cache, tokens)
    query = [*tokens[:70], *random_tokens(model, 10, seed=7)]
    lease = cache.acquire(cache.lookup(ns, query), ns)
    run = model.new_run(lease)
    assert buffer_copies(model, run) == 0  # restoring itself copies nothing
    logits = model.forward(run, query[70:])
    assert buffer_copies(model, run) == len(model.export(run))  # one copy per attention layer
    assert max_diff(logits, full_logits(model, query)[70:]) <= TOLERANCE
    model.close_run(run)
    cache.release(lease)


def test_sliding_exports_keep_the_margin_and_never_more():
    model = tiny("tiny-mistral")
    tokens = random_tokens(model, 500, seed=8)
    run = model.new_run()
    for i in range(0, 500, 7):
        model.forward(run, tokens[i : i + 7])
        for state in model.export(run):
            assert isinstance(state, RotatingKV)
            assert state.seen == run.length
            assert state.rows == min(run.length, state.window - 1 + 64)
    model.close_run(run)


def test_one_lease_restored_twice_gives_independent_recurrent_state():
    model = tiny("tiny-lfm2")
    prefix = random_tokens(model, 50, seed=9)
    x, y = random_tokens(model, 10, seed=10), random_tokens(model, 10, seed=11)
    cache = PrefixCache()
    store(model, cache, prefix)
    ns = namespace(model)
    lease = cache.acquire(cache.lookup(ns, [*prefix, *x]), ns)
    b, c = model.new_run(lease), model.new_run(lease)  # misuse the engine avoids; still must not alias
    out_b, out_c = model.forward(b, x), model.forward(c, y)
    assert max_diff(out_b, full_logits(model, [*prefix, *x])[50:]) <= TOLERANCE
    assert max_diff(out_c, full_logits(model, [*prefix, *y])[50:]) <= TOLERANCE
    model.close_run(b)
    model.close_run(c)
    cache.release(lease)
