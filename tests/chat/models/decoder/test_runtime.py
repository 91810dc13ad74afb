"""chat.models.decoder.runtime: the DecoderAdapter's runs (empty or from a lease of the same layout), its one-forward
steps and their fall-back to one feed at a time, rewind/snapshot/export. Its logits against transformers' are in
test_model.py; adapters' residency parts in test_lora.py."""

from __future__ import annotations

import pytest
import torch

from cache import PrefixCache
from chat.engine.runtime import Feed
from chat.models import RunStateError
from tests.chat.models.helpers import full_logits, namespace, random_tokens, store, tiny
from tests.chat.models.runtime_helpers import POISON, Poisoned

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama():
    return tiny("tiny-llama")


def test_the_own_decoder_serves_the_attention_families(llama):
    from chat.models.decoder.runtime import DecoderAdapter

    assert isinstance(llama, DecoderAdapter) and llama.can_rewind and not llama.has_recurrent_state


def test_a_run_twice_in_one_batch_is_refused(llama):
    run = llama.new_run()
    with pytest.raises(RunStateError, match="twice"):
        llama.forward_batch([Feed(run, [5], 1), Feed(run, [6], 1)])
    assert run.length == 0
    llama.close_run(run)


def test_a_failed_shared_forward_reruns_each_feed_alone(llama, monkeypatch):
    good, bad = random_tokens(llama, 6, seed=1), [5, POISON, 9]
    expected = full_logits(llama, good)
    poisoned = Poisoned(llama._model)
    monkeypatch.setattr(llama, "_model", poisoned)
    runs = [llama.new_run(), llama.new_run()]
    out = llama.forward_batch([Feed(runs[0], good, len(good)), Feed(runs[1], bad, 1)])
    assert poisoned.calls == 3 and poisoned.failed == 2  # together, then each alone
    assert torch.allclose(out[0], expected, atol=1e-5) and runs[0].length == len(good)  # as if nothing happened
    assert isinstance(out[1], RuntimeError) and runs[1].broken and runs[1].length == 0
    with pytest.raises(RunStateError, match="inconsistent"):
        llama.forward(runs[1], [5])
    (more,) = llama.forward_batch([Feed(runs[0], [5], 1)])  # the good run goes on
    assert torch.allclose(more[0], full_logits(llama, [*good, 5])[-1], atol=1e-4)
    for run in runs:
        llama.close_run(run)


def test_a_lease_must_fit_the_layers(llama):
    mistral = tiny("tiny-mistral")  # sliding layers: RotatingKV states
    cache = PrefixCache()
    tokens = random_tokens(mistral, 12, seed=2)
    store(mistral, cache, tokens)
    ns = namespace(mistral)
    lease = cache.acquire(cache.lookup(ns, [*tokens, 3]), ns)
    try:
        with pytest.raises(RunStateError, match="layer 0: expected NormalKV, got RotatingKV"):
            llama.new_run(lease)
    finally:
        cache.release(lease)
    with pytest.raises(RunStateError, match="LoraAdapter"):
        llama.new_run(adapter="not-an-adapter")


def test_a_run_from_a_lease_holds_its_length_and_goes_on(llama):
    cache = PrefixCache()
    tokens = random_tokens(llama, 10, seed=3)
    store(llama, cache, tokens)
    ns = namespace(llama)
    lease = cache.acquire(cache.lookup(ns, [*tokens, 4]), ns)
    run = llama.new_run(lease)
    try:
        assert run.length == 10
        got = llama.forward(run, [4])
    finally:
        llama.close_run(run)
        cache.release(lease)
    assert torch.allclose(got, full_logits(llama, [*tokens, 4])[-1:], atol=1e-4)


def test_rewind_snapshot_export_and_close(llama):
    run = llama.new_run()
    tokens = random_tokens(llama, 8, seed=4)
    llama.forward(run, tokens)
    llama.rewind(run, 0)
    assert run.length == 8
    llama.rewind(run, 3)
    assert run.length == 5
    llama.snapshot(run)  # nothing to record: no recurrent layer
    assert run.snapshots == {}
    layers = llama.export(run)
    assert len(layers) == len(llama._model.args.windows)  # one state per layer
    assert all(layer.length == 5 for layer in layers)
    llama.close_run(run)
    assert run.state is None
    with pytest.raises(RunStateError, match="closed"):
        llama.snapshot(run)
