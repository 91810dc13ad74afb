"""Rewinding a run over draft tokens that a verification rejected: the K/V rows are forgotten (and written over by
the next forward), the logits that follow are those of a run that never saw the drafts, and nothing that a cache
entry or another run may hold can be rewound."""

from __future__ import annotations

import pytest
import torch

from cache import PrefixCache
from chat.models.errors import RunStateError
from chat.models.kv_rows import AttentionRows
from tests.chat.models.helpers import (
    FULL,
    HYBRID,
    SLIDING,
    TOLERANCE,
    full_logits,
    max_diff,
    namespace,
    random_tokens,
    store,
    tiny,
)

torch.set_num_threads(1)


def kv(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 2, n, 3)
    return pos.clone(), -pos.clone()


def positions(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t[0, 0, :, 0].tolist()]


# ==================================================================== the rows


def test_dropped_rows_are_forgotten_and_written_over():
    rows = AttentionRows(None, 0, max_rows=10_000)
    rows.append(*kv(0, 5))
    rows.append(*kv(100, 4))  # four drafts
    rows.drop_last(3)  # one kept
    assert rows.seen == 6 and rows.mark.filled == 6
    k, v = rows.append(*kv(6, 2))
    assert positions(k) == [0, 1, 2, 3, 4, 100, 6, 7] and positions(-v) == positions(k)
    assert rows.copies == 0


def test_rows_below_an_export_or_a_restore_cannot_be_dropped():
    rows = AttentionRows(None, 0, max_rows=10_000)
    rows.append(*kv(0, 5))
    entry = rows.export()
    rows.append(*kv(5, 2))
    with pytest.raises(ValueError):
        rows.drop_last(3)  # would reach into the exported rows
    rows.drop_last(2)
    assert positions(entry.keys) == list(range(5))
    other = AttentionRows(None, 0, max_rows=10_000)
    other.restore(entry)
    with pytest.raises(ValueError):
        other.drop_last(1)


def test_a_run_that_lost_the_tip_cannot_drop_rows():
    a = AttentionRows(None, 0, max_rows=10_000)
    a.append(*kv(0, 4))
    entry = a.export()
    b = AttentionRows(None, 0, max_rows=10_000)
    b.restore(entry)
    b.append(*kv(4, 2))  # b takes the tip of the shared buffer
    a.append(*kv(4, 1))  # a copies into a buffer of its own, where it is the tip
    assert a.copies == 1
    a.drop_last(1)
    b.drop_last(2)
    assert positions(b.append(*kv(4, 1))[0]) == list(range(5))


def test_sliding_rows_drop_and_keep_the_window():
    rows = AttentionRows(4, 4 - 1 + 2, max_rows=10_000)
    for p in range(0, 30, 3):
        rows.append(*kv(p, 3))
        rows.drop_last(1)  # keep two of each three
        rows.append(*kv(p + 2, 1))
    k, _ = rows.append(*kv(30, 1))
    assert positions(k)[-4:] == [27, 28, 29, 30]
    assert rows.mask_sizes(1) == (4, 28)


# ==================================================================== the adapter


def verify_then_continue(model, tokens: list[int], cut: int, drafts: int, kept: int) -> torch.Tensor:
    """Forward tokens[:cut], then tokens[cut] with ``drafts`` wrong drafts of which ``kept`` turn out right (the
    tokens themselves), rewind, then forward the rest one by one; logits of tokens[cut:]."""
    run = model.new_run()
    model.forward(run, tokens[:cut])
    wrong = [(t + 7) % model.vocab_size for t in tokens[cut + 1 + kept : cut + 1 + drafts]]
    fed = tokens[cut : cut + 1 + kept] + wrong
    logits = model.forward(run, fed)[: 1 + kept]
    model.rewind(run, drafts - kept)
    assert run.length == cut + 1 + kept
    rest = [model.forward(run, [t]) for t in tokens[cut + 1 + kept :]]
    model.close_run(run)
    return torch.cat([logits, *rest])


@pytest.mark.parametrize("spec", FULL + SLIDING)
def test_logits_after_a_rewind_are_those_of_a_run_without_the_drafts(spec):
    model = tiny(spec)
    assert model.can_rewind
    tokens = random_tokens(model, 40, seed=3)
    want = full_logits(model, tokens)
    for cut, drafts, kept in ((12, 4, 0), (20, 6, 2), (30, 3, 3)):  # sliding window 8: drafts reach past it
        got = verify_then_continue(model, tokens, cut, drafts, kept)
        assert max_diff(got, want[cut:]) <= TOLERANCE


@pytest.mark.parametrize("spec", FULL + SLIDING)
def test_a_rewind_never_reaches_into_a_lease_or_an_export(spec):
    model = tiny(spec)
    tokens = random_tokens(model, 30, seed=4)
    cache = PrefixCache()
    store(model, cache, tokens[:20])
    ns = namespace(model)
    lease = cache.acquire(cache.lookup(ns, tokens), ns)
    run = model.new_run(lease)
    with pytest.raises(RunStateError):
        model.rewind(run, 1)
    model.forward(run, tokens[20:25])
    model.export(run)
    with pytest.raises(RunStateError):
        model.rewind(run, 1)
    model.forward(run, tokens[25:28])
    model.rewind(run, 3)
    assert run.length == 25
    with pytest.raises(RunStateError):
        model.rewind(run, 1)
    model.close_run(run)
    cache.release(lease)


@pytest.mark.parametrize("spec", HYBRID)
def test_runs_of_recurrent_models_cannot_rewind(spec):
    model = tiny(spec)
    assert not model.can_rewind
    run = model.new_run()
    model.forward(run, random_tokens(model, 4, seed=5))
    with pytest.raises(RunStateError, match="recurrent"):
        model.rewind(run, 1)
    model.close_run(run)
