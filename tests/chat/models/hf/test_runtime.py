"""chat.models.hf.runtime: the TransformersAdapter's runs (empty or from a lease of its slots), its steps (decode steps
of a recurrent model stacked into one forward, longer feeds alone) and their fall-back to one feed at a time,
snapshots and exports of recurrent state, no rewinds. Through tiny-lfm2 (short convolutions beside attention)."""

from __future__ import annotations

import pytest
import torch

from cache import Namespace, PrefixCache, RecurrentState
from chat.engine.runtime import Feed
from chat.models import RunStateError
from tests.chat.models.helpers import full_logits, random_tokens, store, tiny
from tests.chat.models.runtime_helpers import POISON, Poisoned

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lfm2():
    return tiny("tiny-lfm2")


def test_a_lease_of_another_layout_is_refused():
    llama, hybrid = tiny("tiny-llama"), tiny("tiny-lfm2")
    cache = PrefixCache()
    tokens = random_tokens(llama, 20, seed=1)
    store(llama, cache, tokens)
    ns = Namespace(llama.fingerprint, llama.dtype)
    lease = cache.acquire(cache.lookup(ns, [*tokens, 3]), ns)
    with pytest.raises(RunStateError):
        hybrid.new_run(lease)
    cache.release(lease)


def test_a_recurrent_model_runs_on_transformers_forward(lfm2):
    from chat.models.hf.runtime import TransformersAdapter

    assert isinstance(lfm2, TransformersAdapter) and lfm2.has_recurrent_state and not lfm2.can_rewind
    run = lfm2.new_run()
    lfm2.forward(run, [5, 6])
    lfm2.rewind(run, 0)  # nothing to forget: allowed
    with pytest.raises(RunStateError, match="recurrent"):
        lfm2.rewind(run, 1)
    lfm2.close_run(run)


def test_a_run_twice_in_one_batch_is_refused(lfm2):
    run = lfm2.new_run()
    with pytest.raises(RunStateError, match="twice"):
        lfm2.forward_batch([Feed(run, [5], 1), Feed(run, [6], 1)])
    lfm2.close_run(run)


def test_decode_steps_are_stacked_and_equal_each_run_alone(lfm2, monkeypatch):
    prompts = [random_tokens(lfm2, n, seed=n) for n in (4, 7, 5)]
    runs = [lfm2.new_run() for _ in prompts]
    lfm2.forward_batch([Feed(r, p, 1) for r, p in zip(runs, prompts, strict=True)])
    counting = Poisoned(lfm2._model)
    monkeypatch.setattr(lfm2, "_model", counting)
    out = lfm2.forward_batch([Feed(r, [9], 1) for r in runs])
    assert counting.calls == 1  # three decode steps, one forward
    for got, prompt in zip(out, prompts, strict=True):
        assert torch.allclose(got[0], full_logits(lfm2, [*prompt, 9])[-1], atol=1e-4)
    for run in runs:
        lfm2.close_run(run)


def test_a_failed_stacked_step_reruns_each_feed_alone(lfm2, monkeypatch):
    prompts = [random_tokens(lfm2, 5, seed=s) for s in (1, 2)]
    runs = [lfm2.new_run() for _ in prompts]
    lfm2.forward_batch([Feed(r, p, 1) for r, p in zip(runs, prompts, strict=True)])
    poisoned = Poisoned(lfm2._model)
    monkeypatch.setattr(lfm2, "_model", poisoned)
    out = lfm2.forward_batch([Feed(runs[0], [9], 1), Feed(runs[1], [POISON], 1)])
    assert poisoned.calls == 3 and poisoned.failed == 2  # stacked, then each alone
    assert torch.allclose(out[0][0], full_logits(lfm2, [*prompts[0], 9])[-1], atol=1e-4) and runs[0].length == 6
    assert isinstance(out[1], RuntimeError) and runs[1].broken and runs[1].length == 5
    for run in runs:
        lfm2.close_run(run)


def test_snapshots_are_recorded_and_exported_and_a_missing_one_is_taken(lfm2):
    run = lfm2.new_run()
    lfm2.snapshot(run)  # before the first token: nothing
    assert run.snapshots == {}
    lfm2.forward(run, random_tokens(lfm2, 4, seed=5))
    lfm2.snapshot(run)
    lfm2.forward(run, [5, 6])
    recurrent = [i for i, slot in enumerate(lfm2._layout.slots) if slot.kind == "recurrent"]
    assert recurrent and all(set(run.snapshots[i]) == {4} for i in recurrent)
    layers = lfm2.export(run)  # the snapshot at 6 is taken first
    for i in recurrent:
        assert isinstance(layers[i], RecurrentState) and set(layers[i].snapshots) == {4, 6}
    lfm2.close_run(run)
    assert run.state is None and run.snapshots == {} and run.inherited == {}
    with pytest.raises(RunStateError, match="closed"):
        lfm2.export(run)


def test_a_run_from_a_lease_inherits_the_snapshots_and_goes_on(lfm2):
    cache = PrefixCache()
    tokens = random_tokens(lfm2, 12, seed=6)
    store(lfm2, cache, tokens, snapshots_at=(6,))
    ns = Namespace(lfm2.fingerprint, lfm2.dtype)
    lease = cache.acquire(cache.lookup(ns, [*tokens, 4]), ns)
    run = lfm2.new_run(lease)
    try:
        assert run.length == 12 and run.inherited and all(12 in s for s in run.inherited.values())
        got = lfm2.forward(run, [4])
    finally:
        lfm2.close_run(run)
        cache.release(lease)
    assert torch.allclose(got, full_logits(lfm2, [*tokens, 4])[-1:], atol=1e-4)
