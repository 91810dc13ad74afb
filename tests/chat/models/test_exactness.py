"""A restored state gives the logits of an uncached run, for every cache kind (max abs diff <= 1e-4, float32).

Each test runs a sequence from empty, exports it at a cut, goes through a real PrefixCache (insert, lookup,
acquire), restores into a new run, forwards the rest (chunks, then single decode steps) and compares logits with one
uncached forward over the whole sequence. The tiny models' weights are wide enough that a wrong state shows up
(see ``test_a_wrong_state_is_detected``)."""

from __future__ import annotations

import pytest

from cache import PrefixCache, RecurrentState, RotatingKV
from chat.models.tiny.text import WINDOW
from tests.chat.models.helpers import (
    ALL_TINY,
    HYBRID,
    SLIDING,
    TOLERANCE,
    full_logits,
    max_diff,
    namespace,
    random_tokens,
    restored_logits,
    store,
    tiny,
)

MARGIN = 64  # chat.models.adapter.DEFAULT_ROTATING_MARGIN


@pytest.mark.parametrize("spec", ALL_TINY)
@pytest.mark.parametrize("cut", [1, WINDOW + 1, 63, 150])
def test_restore_at_a_cut_matches_the_full_forward(spec, cut):
    model = tiny(spec)
    tokens = random_tokens(model, 200, seed=cut)  # 200 >> window: sliding layers roll over many times
    full = full_logits(model, tokens)
    cache = PrefixCache()
    store(model, cache, tokens[:cut])
    hit, rest = restored_logits(model, cache, tokens)
    assert hit == cut
    assert max_diff(rest, full[cut:]) <= TOLERANCE


@pytest.mark.parametrize("spec", ALL_TINY)
def test_a_wrong_state_is_detected(spec):
    """The comparison has power: restoring the state of a different prefix moves the logits far beyond tolerance."""
    model = tiny(spec)
    tokens = random_tokens(model, 60, seed=7)
    other = random_tokens(model, 60, seed=8)
    full = full_logits(model, tokens)
    cache = PrefixCache()
    store(model, cache, other[:40])
    _, wrong = restored_logits(model, cache, [*other[:40], *tokens[40:]], pieces=())
    assert max_diff(wrong[:4], full[40:44]) > 100 * TOLERANCE


@pytest.mark.parametrize("spec", ["tiny-llama", *HYBRID])
def test_full_attention_rewinds_anywhere_and_recurrent_only_to_snapshots(spec):
    model = tiny(spec)
    tokens = random_tokens(model, 150, seed=3)
    cache = PrefixCache()
    store(model, cache, tokens, snapshots_at=(40, 90))
    query = [*tokens[:120], *random_tokens(model, 30, seed=4)]  # diverges at 120
    hit, rest = restored_logits(model, cache, query)
    assert hit == (120 if not model.has_recurrent_state else 90)
    assert max_diff(rest, full_logits(model, query)[hit:]) <= TOLERANCE


@pytest.mark.parametrize("spec", HYBRID)
def test_snapshots_inherited_from_the_lease_are_exported_again(spec):
    model = tiny(spec)
    tokens = random_tokens(model, 200, seed=5)
    cache = PrefixCache()
    ns = namespace(model)
    store(model, cache, tokens[:100], snapshots_at=(30, 60))
    lease = cache.acquire(cache.lookup(ns, tokens), ns)
    run = model.new_run(lease)
    model.forward(run, tokens[100:150])
    model.snapshot(run)
    model.forward(run, tokens[150:])
    layers = model.export(run)  # takes the snapshot at 200 itself
    recurrent = [s for s in layers if isinstance(s, RecurrentState)]
    assert recurrent and all(sorted(s.snapshots) == [30, 60, 100, 150, 200] for s in recurrent)
    cache.insert(ns, tokens, layers)
    model.close_run(run)
    cache.release(lease)
    query = [*tokens[:75], *random_tokens(model, 20, seed=6)]  # diverges between the inherited 60 and 100
    hit, rest = restored_logits(model, cache, query)
    assert hit == 60
    assert max_diff(rest, full_logits(model, query)[60:]) <= TOLERANCE


@pytest.mark.parametrize("spec", SLIDING)
def test_sliding_layers_rewind_within_the_margin_and_no_further(spec):
    model = tiny(spec)
    tokens = random_tokens(model, 300, seed=9)
    cache = PrefixCache()
    store(model, cache, tokens)
    ns = namespace(model)
    exported = cache.acquire(cache.lookup(ns, [*tokens, 5]), ns)
    rotating = [s for s in exported.layers if isinstance(s, RotatingKV)]
    assert rotating and all(s.window == WINDOW and s.seen == 300 for s in rotating)
    cache.release(exported)
    shortest = 300 - MARGIN  # the entry holds W - 1 + MARGIN rows
    query = [*tokens[: shortest + 10], *random_tokens(model, 40, seed=10)]
    hit, rest = restored_logits(model, cache, query)
    assert hit == shortest + 10
    assert max_diff(rest, full_logits(model, query)[hit:]) <= TOLERANCE
    too_far = [*tokens[: shortest - 10], *random_tokens(model, 40, seed=11)]
    assert cache.lookup(ns, too_far) is None


def test_bfloat16_runs_restore_too():
    model = tiny("tiny-mistral", "bfloat16")
    assert model.dtype == "bfloat16"
    tokens = random_tokens(model, 80, seed=12)
    full = full_logits(model, tokens)
    assert full.dtype.is_floating_point and full.dtype.itemsize == 4  # logits come back as float32
    cache = PrefixCache()
    store(model, cache, tokens[:50])  # the cache checks that K/V are bfloat16, as the namespace says
    hit, rest = restored_logits(model, cache, tokens)
    assert hit == 50
    assert max_diff(rest, full[50:]) <= 0.05
