"""chat.models.hf.ragged: each run's queries in a packed row attend to that run's own K/V only, with the causal and
sliding-window rules of a forward alone; and the adapter's ``forward_batch`` gives each feed what a forward alone
gives, rolls every run back when a packed forward fails, and reports a bad feed without touching the others."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from chat.engine.runtime import Feed
from chat.models import load_model
from chat.models.errors import InvalidSettingError, RunStateError
from chat.models.hf import ragged
from chat.models.kv_rows import AttentionRows

torch.set_num_threads(1)


def reference(query, key, value, window, scale):
    """SDPA of ``query [1, H, q, D]`` (the last q of kv positions) over ``key``/``value [1, Hk, kv, D]``."""
    q, kv = query.shape[2], key.shape[2]
    pos_q = torch.arange(kv - q, kv).unsqueeze(1)
    pos_k = torch.arange(kv).unsqueeze(0)
    mask = pos_k <= pos_q
    if window is not None:
        mask &= pos_k > pos_q - window
    groups = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale).transpose(1, 2)[0]


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (9, 3)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(
    "shapes",  # (new tokens q, visible rows kv) per slot
    [[(1, 7), (3, 3), (20, 30), (1, 1), (2, 11)], [(1, 7), (1, 300), (1, 1), (1, 40)]],
    ids=["mixed", "decode-only"],
)
@pytest.mark.parametrize("strided", [False, True], ids=["rows", "some-strided"])
def test_each_slot_attends_to_its_own_rows_with_its_own_mask(heads, kv_heads, window, shapes, strided, kernel_path):
    """With ``strided``, every other slot's K/V have a last dimension that is not contiguous: the native kernel
    leaves those slots to torch and takes the others gathered out of the packed row."""
    g = torch.Generator().manual_seed(0)
    total = sum(q for q, _ in shapes)
    query = torch.randn(1, heads, total, 8, generator=g) * 2
    views = []
    for i, (_, kv) in enumerate(shapes):
        if strided and i % 2 == 0:
            k, v = (torch.randn(1, kv_heads, 8, kv + 1, generator=g)[..., :kv].transpose(-1, -2) for _ in range(2))
        else:
            k, v = (torch.randn(1, kv_heads, kv, 8, generator=g) for _ in range(2))
        views.append((k, v))
    slots, start = [], 0
    for q, _ in shapes:
        slots.append(ragged.PackedRun(0, start, start + q, cache=None))
        start += q
    pack = ragged.Pack(slots, kv=[(k[0], v[0]) for k, v in views], window=window)  # what the layers hand on
    with ragged.active(pack):
        out, weights = ragged.ragged_attention(nn.Module(), query, None, None, None, scaling=0.3)
    assert weights is None and out.shape == (1, total, heads, 8) and pack.kv is None  # the views were taken
    for slot, (k, v), (q, _) in zip(slots, views, shapes, strict=True):
        # one-token queries see every row they are given (the layer hands a sliding query only its window)
        want = reference(query[:, :, slot.start : slot.end], k, v, None if q == 1 else window, 0.3)
        assert (out[0, slot.start : slot.end] - want).abs().max().item() < 1e-5


def test_outside_a_pack_it_is_sdpa():
    g = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(1, 4, 6, 8, generator=g) for _ in range(3))
    out, _ = ragged.ragged_attention(nn.Module(), query, key, value, None, scaling=0.5, is_causal=True)
    want = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.5).transpose(1, 2)
    assert (out - want).abs().max().item() < 1e-6


def test_rows_roll_back_to_a_checkpoint_whether_appended_in_place_or_reallocated():
    rows = AttentionRows(None, 0, 4096)
    k = torch.randn(1, 2, 5, 4)
    rows.append(k, k)
    exported = rows.export()
    point = rows.checkpoint()
    rows.append(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))  # in place, at the tip
    rows.rollback(point)
    assert rows.seen == 5 and rows.at_tip() and rows.mark.filled == 5
    assert torch.equal(rows.export().keys, exported.keys)
    rows.append(torch.randn(1, 2, 400, 4), torch.randn(1, 2, 400, 4))  # past the capacity: a new buffer
    assert rows.copies == 1
    rows.rollback(point)
    assert rows.seen == 5 and rows.keys is point[0] and torch.equal(rows.export().keys, exported.keys)


# ==================================================================== the adapter


@pytest.fixture(scope="module")
def llama():
    return load_model("tiny-llama")


def test_a_batch_gives_each_feed_what_it_gets_alone_and_asks_only_the_logits_wanted(llama):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18], [19]]
    alone = []
    for p in prompts:
        run = llama.new_run()
        alone.append(llama.forward(run, p))
        llama.close_run(run)
    runs = [llama.new_run() for _ in prompts]
    wanted = [5, 1, 0, 1]
    calls = []
    hook = llama._model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    try:
        outs = llama.forward_batch([Feed(r, p, n) for r, p, n in zip(runs, prompts, wanted, strict=True)])
    finally:
        hook.remove()
    assert len(calls) == 1  # one packed forward (not a failed one and four forwards alone)
    for out, ref, n in zip(outs, alone, wanted, strict=True):
        if n == 0:
            assert out is None
        else:
            assert out.shape == (n, llama.vocab_size) and (out - ref[len(ref) - n :]).abs().max().item() < 1e-5
    assert [r.length for r in runs] == [len(p) for p in prompts]


def test_a_bad_feed_gets_its_error_and_the_others_run(llama):
    runs = [llama.new_run() for _ in range(3)]
    closed = llama.new_run()
    llama.close_run(closed)
    feeds = [
        Feed(runs[0], [5, 6], 1),
        Feed(runs[1], [llama.vocab_size], 1),  # outside the vocabulary
        Feed(runs[2], [7], 2),  # more logits than tokens
        Feed(closed, [8], 1),
        Feed(llama.new_run(), [], 0),
    ]
    outs = llama.forward_batch(feeds)
    assert isinstance(outs[0], torch.Tensor) and runs[0].length == 2
    assert isinstance(outs[1], InvalidSettingError) and isinstance(outs[2], InvalidSettingError)
    assert isinstance(outs[3], RunStateError) and isinstance(outs[4], InvalidSettingError)
    assert runs[1].length == 0 and runs[2].length == 0 and not runs[1].broken


def test_a_failed_packed_forward_rolls_back_and_reruns_each_feed_alone(llama, monkeypatch):
    base = [llama.new_run() for _ in range(3)]
    llama.forward_batch([Feed(r, [20 + i, 21, 22], 0) for i, r in enumerate(base)])
    want = []
    for i in range(3):
        run = llama.new_run()
        llama.forward(run, [20 + i, 21, 22])
        want.append(llama.forward(run, [30, 31]))
    layers = next(m for name, m in llama._model.named_modules() if name.endswith("layers"))
    calls = {"n": 0}

    def fail_packed_once(module, args, kwargs):
        calls["n"] += 1
        if calls["n"] == 1:  # the packed forward, after every other layer appended its rows
            raise RuntimeError("boom")

    hook = layers[-1].register_forward_pre_hook(fail_packed_once, with_kwargs=True)
    try:
        outs = llama.forward_batch([Feed(r, [30, 31], 2) for r in base])
    finally:
        hook.remove()
    assert calls["n"] == 4  # the packed forward, then each feed alone
    for out, ref, run in zip(outs, want, base, strict=True):
        assert run.length == 5 and (out - ref).abs().max().item() < 1e-5


def test_two_runs_restored_from_one_buffer_can_share_a_forward(llama):
    from cache import Namespace, PrefixCache

    cache, ns = PrefixCache(), Namespace(llama.fingerprint, llama.dtype)
    run = llama.new_run()
    llama.forward(run, [5, 6, 7, 8])
    cache.insert(ns, [5, 6, 7, 8], llama.export(run))
    llama.close_run(run)
    leases = [cache.acquire(cache.lookup(ns, [5, 6, 7, 8, 9]), ns) for _ in range(2)]
    runs = [llama.new_run(lease) for lease in leases]
    outs = llama.forward_batch([Feed(runs[0], [9, 10], 2), Feed(runs[1], [11, 12], 2)])
    for tail, out in zip(([9, 10], [11, 12]), outs, strict=True):
        fresh = llama.new_run()
        assert (llama.forward(fresh, [5, 6, 7, 8, *tail])[-2:] - out).abs().max().item() < 1e-5
    for lease in leases:
        cache.release(lease)


@pytest.mark.parametrize(
    "name", ["tiny-qwen3next", "tiny-lfm2", "tiny-falconh1", "tiny-granitemoehybrid", "tiny-zamba2"]
)
def test_hybrid_models_stack_decode_steps_in_one_forward_and_run_longer_feeds_alone(name):
    model = load_model(name)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]

    def runs():
        out = []
        for p in prompts:
            run = model.new_run()
            model.forward(run, p)
            out.append(run)
        return out

    alone = runs()
    want = [model.forward(alone[0], [20]), model.forward(alone[1], [21]), model.forward(alone[2], [22, 23])]
    want.append(model.forward(alone[0], [24]))
    calls = []
    hook = model._model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    try:
        batched = runs()
        calls.clear()
        outs = model.forward_batch(
            [Feed(batched[0], [20], 1), Feed(batched[1], [21], 1), Feed(batched[2], [22, 23], 2)]
        )
        assert len(calls) == 2  # the two decode steps stacked, the two-token feed alone
        outs.append(model.forward_batch([Feed(batched[0], [24], 1)])[0])  # the states written back are right
    finally:
        hook.remove()
    assert len(calls) == 2 + 1  # and no forward failed (which would have run each feed alone)
    for out, ref in zip(outs, want, strict=True):
        assert (out - ref).abs().max().item() < 1e-5
