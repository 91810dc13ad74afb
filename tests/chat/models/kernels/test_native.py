"""chat.models.kernels.native: the int8 kernel gives torch's int8 product bit for bit and the decode-attention kernel
gives attention over each sequence's own rows, for any shape, stride and number of threads; the library is built once
per machine and the callers fall back to torch when it cannot be had."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.models.kernels import native
from chat.models.kernels.dense_matrices import int8_linear, quantize_weight

torch.set_num_threads(1)

KERNELS = native.kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no native kernels on this machine")


def table_of(kv, queries=None):
    """An attention table for K/V views ``[Hk, L, D]`` (nothing new to write): sequence i has ``queries[i]`` query
    tokens (1 by default), laid one sequence after the other."""
    queries = queries or [1] * len(kv)
    table, first = native.AttentionTable(), 0
    for (k, v), q in zip(kv, queries, strict=True):
        table.add_views(k, v, queries=q, first=first)
        first += q
    return table


def attention(queries, kv, out, softcap):
    KERNELS.attention(queries, kv[0][0].shape[0], table_of(kv), None, (0, 0), out, softcap)


def attention_reference(queries, kv, softcap):
    """Per sequence: softmax(q . K^T (soft-capped)) . V with query head h reading K/V head h // group."""
    outs = []
    for i, (k, v) in enumerate(kv):
        kv_heads, heads, d = k.shape[0], queries.shape[1], queries.shape[2]
        group = heads // kv_heads
        scores = torch.bmm(queries[i].view(kv_heads, group, d).double(), k.double().transpose(1, 2))
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        outs.append(torch.bmm(torch.softmax(scores, dim=-1), v.double()).reshape(heads, -1))
    return torch.stack(outs).float()


def int8_reference(x, q, scale, bias):
    """fast_paths.int8_linear's arithmetic with the integer sums taken in int64 by a plain matmul."""
    amax = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12)
    quantized = x.div(amax).mul_(127.0).round_().to(torch.int64)
    out = (quantized @ q.to(torch.int64).t()).to(torch.float32).mul(amax).mul_(scale / 127.0)
    return out if bias is None else out + bias


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 20),
    k=st.integers(1, 150),
    n=st.integers(1, 100),
    with_bias=st.booleans(),
    pad=st.integers(0, 9),
    seed=st.integers(0, 2**16),
)
def test_int8_kernel_is_torchs_int8_product_bit_for_bit(m, k, n, with_bias, pad, seed):
    g = torch.Generator().manual_seed(seed)
    q, scale = quantize_weight(torch.randn(n, k, generator=g))
    bias = torch.randn(n, generator=g) if with_bias else None
    x = (torch.randn(m, k + pad, generator=g) * 4)[:, :k]  # rows further apart than their length
    x[0, 0] = 0.0
    got = KERNELS.int8_linear(x, KERNELS.pack_int8(q), q.sum(dim=1, dtype=torch.int32), scale / 127.0, bias)
    assert torch.equal(got, int8_reference(x, q, scale, bias))
    if k > 1:  # torch._int_mm gives wrong sums for one input column and a transposed weight (torch 2.13, CPU)
        assert torch.equal(got, int8_linear(x, q, scale, bias))


@needs_kernels
def test_int8_kernel_treats_a_zero_row_as_torch_does():
    q, scale = quantize_weight(torch.randn(33, 70))
    x = torch.zeros(3, 70)
    x[1] = torch.randn(70)
    got = KERNELS.int8_linear(x, KERNELS.pack_int8(q), q.sum(dim=1, dtype=torch.int32), scale / 127.0, None)
    assert torch.equal(got, int8_linear(x, q, scale, None)) and torch.equal(got[0], torch.zeros(33))


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(
    kv_heads=st.integers(1, 4),
    group=st.integers(1, 4),
    d=st.integers(1, 40),
    dv=st.integers(1, 70),
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=6),
    softcap=st.sampled_from([None, 5.0, 30.0]),
    kv_dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_attention_kernel_gives_each_decode_step_its_own_rows(kv_heads, group, d, dv, lengths, softcap, kv_dtype, seed):
    """Against float64 attention over the rows as stored (float16 rows read exactly into float32)."""
    g = torch.Generator().manual_seed(seed)
    kv = []
    for length in lengths:  # views of larger buffers, as a run's rows are: head stride > length * d
        keys = torch.randn(1, kv_heads, length + 17, d, generator=g).to(kv_dtype)
        values = torch.randn(1, kv_heads, length + 5, dv, generator=g).to(kv_dtype)
        kv.append((keys[0, :, 3 : 3 + length], values[0, :, 2 : 2 + length]))
    queries = torch.randn(len(lengths), kv_heads * group, d, generator=g)
    out = torch.full((len(lengths), kv_heads * group, dv), float("nan"))
    attention(queries, kv, out, softcap)
    assert (out - attention_reference(queries, kv, softcap)).abs().max().item() < 1e-5


@needs_kernels
def test_results_do_not_depend_on_the_number_of_threads_or_of_sequences():
    g = torch.Generator().manual_seed(9)
    q, scale = quantize_weight(torch.randn(300, 64, generator=g))
    packed, wsum, step = KERNELS.pack_int8(q), q.sum(dim=1, dtype=torch.int32), scale / 127.0
    x = torch.randn(11, 64, generator=g)
    kv = [(torch.randn(2, n, 16, generator=g), torch.randn(2, n, 16, generator=g)) for n in (5, 200, 33)]
    queries = torch.randn(3, 6, 16, generator=g)

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        together = torch.empty(3, 6, 16)
        attention(queries, kv, together, None)
        alone = torch.empty(3, 6, 16)
        for i in range(3):
            attention(queries[i : i + 1], kv[i : i + 1], alone[i : i + 1], None)
        return KERNELS.int8_linear(x, packed, wsum, step, None), together, alone

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        two = run()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert torch.equal(one[1], one[2]) and torch.equal(two[1], two[2])


@pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler on this machine")
def test_the_library_is_built_once_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    compiler = os.environ.get("CC") or "cc"
    first = native._build(compiler)
    assert first.parent == tmp_path / "native" and first.exists()
    stamp = first.stat().st_mtime_ns
    again = native._build(compiler)
    assert again == first and again.stat().st_mtime_ns == stamp  # found, not rebuilt
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name, first.name + ".sha256"]  # no scratch left


def test_without_a_compiler_the_torch_paths_are_used(monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level(logging.WARNING, logger="chat.models.kernels.native"):
        assert native._load() is None
    assert "no C compiler" in caplog.text


def test_a_compiler_error_leaves_the_torch_paths(tmp_path, monkeypatch, caplog):
    script = tmp_path / "failing-cc"
    script.write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("CC", str(script))
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path / "home"))
    with caplog.at_level(logging.WARNING, logger="chat.models.kernels.native"):
        assert native._load() is None
    assert "could not be built" in caplog.text and "internal error" in caplog.text


def test_disabled_turns_the_kernels_off_for_a_block():
    with native.disabled():
        assert native.kernels() is None
    assert native.kernels() is KERNELS


@needs_kernels
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_attention_kernel_writes_each_new_token_into_its_last_row_first(kv_dtype):
    """float16 rows get the new K/V rounded as torch rounds them (``.to(torch.float16)``), bit for bit."""
    g = torch.Generator().manual_seed(11)
    buffers = [
        (torch.randn(1, 2, 64, 8, generator=g).to(kv_dtype), torch.randn(1, 2, 64, 12, generator=g).to(kv_dtype))
        for _ in range(3)
    ]
    size = buffers[0][0].element_size()
    lengths = [1, 9, 40]
    new = torch.randn(4, 2, 1, 8, generator=g).transpose(1, 2).reshape(4, 2, 8)  # [tokens, Hk, D]
    new_v = torch.randn(4, 2, 12, generator=g)
    tokens = [3, 0, 2]  # which new token each sequence takes
    table = native.AttentionTable(1)  # grows as rows are added
    for i, ((k, v), n, t) in enumerate(zip(buffers, lengths, tokens, strict=True)):
        table.add(
            k.data_ptr() + 5 * k.stride(2) * size,  # the visible rows start at row 5
            k.stride(1),
            k.stride(2),
            v.data_ptr() + 5 * v.stride(2) * size,
            v.stride(1),
            v.stride(2),
            n,
            new_key=new.data_ptr() + t * new.stride(0) * 4,  # the new K/V are float32
            new_value=new_v.data_ptr() + t * new_v.stride(0) * 4,
            queries=1,
            first=i,
            half=native.KV_DTYPES[kv_dtype],
        )
    queries = torch.randn(3, 6, 8, generator=g)
    out = torch.empty(3, 6, 12)
    KERNELS.attention(queries, 2, table, None, (new.stride(1), new_v.stride(1)), out, None)
    views = []
    for (k, v), n, t in zip(buffers, lengths, tokens, strict=True):
        assert torch.equal(k[0, :, 5 + n - 1], new[t].to(kv_dtype))
        assert torch.equal(v[0, :, 5 + n - 1], new_v[t].to(kv_dtype))
        views.append((k[0, :, 5 : 5 + n], v[0, :, 5 : 5 + n]))
    assert (out - attention_reference(queries, views, None)).abs().max().item() < 1e-5


def chunk_reference(query, key, value, window, softcap):
    """``query [q, H, D]`` (the last q of L positions) over ``key``/``value [Hk, L, D]``: causal, within ``window``
    (for more than one query token)."""
    q, rows = query.shape[0], key.shape[1]
    group = query.shape[1] // key.shape[0]
    own = torch.arange(rows - q, rows).unsqueeze(1)
    cols = torch.arange(rows).unsqueeze(0)
    mask = cols <= own
    if window is not None and q > 1:  # a lone query token sees every row it is given
        mask &= cols > own - window
    k, v = key.repeat_interleave(group, 0).double(), value.repeat_interleave(group, 0).double()
    scores = torch.einsum("qhd,hkd->hqk", query.double(), k)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,hkd->qhd", torch.softmax(scores, dim=-1), v).float()


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    d=st.integers(1, 40),
    chunks=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 40)), min_size=1, max_size=5),
    window=st.sampled_from([None, 1, 3, 16]),
    softcap=st.sampled_from([None, 20.0]),
    kv_dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_attention_kernel_gives_chunks_their_causal_window(kv_heads, group, d, chunks, window, softcap, kv_dtype, seed):
    """Sequences with several query tokens (prefill chunks: q new tokens after `before` earlier rows)."""
    g = torch.Generator().manual_seed(seed)
    kv, queries = [], []
    for q, before in chunks:
        keys = torch.randn(1, kv_heads, q + before + 7, d, generator=g).to(kv_dtype)
        values = torch.randn(1, kv_heads, q + before + 3, d, generator=g).to(kv_dtype)
        kv.append((keys[0, :, 2 : 2 + q + before], values[0, :, 1 : 1 + q + before]))
        queries.append(q)
    tokens = torch.randn(sum(queries), kv_heads * group, d, generator=g)
    out = torch.full((sum(queries), kv_heads * group, d), float("nan"))
    KERNELS.attention(tokens, kv_heads, table_of(kv, queries), window, (0, 0), out, softcap)
    first = 0
    for (k, v), q in zip(kv, queries, strict=True):
        want = chunk_reference(tokens[first : first + q], k, v, window, softcap)
        assert (out[first : first + q] - want).abs().max().item() < 1e-5
        first += q


@needs_kernels
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-gemma3"])
def test_int8_logits_do_not_depend_on_how_the_prompt_is_cut(name):
    """With the native kernels every position's attention is computed the same way in any chunk, and int8 linear
    layers are exact per token: the logits of a prompt fed whole, in odd chunks, or token by token (as a cached
    prefix and its new tokens would be) are equal bit for bit."""
    from chat.models import load_model

    model = load_model(name, weights="int8")
    ids = [(37 * i + 11) % (model.vocab_size - 1) + 1 for i in range(90)]

    def logits(chunks):
        run, out, at = model.new_run(), [], 0
        for size in chunks:
            out.append(model.forward(run, ids[at : at + size]))
            at += size
        model.close_run(run)
        return torch.cat(out)

    whole = logits([90])
    assert torch.equal(logits([17, 1, 40, 2, 30]), whole)
    assert torch.equal(logits([1] * 90), whole)
