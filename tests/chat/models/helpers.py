"""Shared helpers for the model adapter tests: tiny models loaded once per session, random token sequences, and the
cut-export-insert-lookup-restore round trip the exactness tests repeat."""

from __future__ import annotations

import contextlib
import functools
import random

import pytest
import torch

from cache import Namespace, PrefixCache
from chat.models import load_model
from chat.models.decoder import model as decoder_model
from chat.models.kernels.dense_matrices import BlasForms

TOLERANCE = 1e-4  # max abs logit difference between a restored and an uncached run (float32)
FULL = ["tiny-llama"]
SLIDING = ["tiny-mistral", "tiny-gemma3"]
HYBRID = ["tiny-qwen3next", "tiny-lfm2", "tiny-falconh1", "tiny-granitemoehybrid", "tiny-zamba2"]
ALL_TINY = FULL + SLIDING + HYBRID


@contextlib.contextmanager
def default_blas_forms():
    """float32 loads in the block keep the default BLAS forms. A load times two forms per weight shape and keeps the
    faster (:func:`chat.models.kernels.dense_matrices.calibrate`); the forms round differently, so two loads compared
    bit for bit must not depend on a timing: the weights are compared, not the machine's noise."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoder_model, "calibrate", lambda weights, rounds=0: BlasForms())
        yield


@functools.cache
def tiny(spec: str, dtype: str = "float32"):
    return load_model(spec, dtype)


def random_tokens(model, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, model.vocab_size) for _ in range(n)]  # 0..2 are the special tokens


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of an uncached run over all of ``tokens``: [len(tokens), vocab]."""
    run = model.new_run()
    try:
        return model.forward(run, tokens)
    finally:
        model.close_run(run)


def forward_pieces(model, run, tokens: list[int], pieces: tuple[int, ...] = (5, 1, 1, 1)) -> torch.Tensor:
    """Forward ``tokens`` as a few chunks, then single tokens (decode), then the rest: [len(tokens), vocab]."""
    out, at = [], 0
    for size in pieces:
        if at >= len(tokens):
            break
        out.append(model.forward(run, tokens[at : at + size]))
        at += size
    if at < len(tokens):
        out.append(model.forward(run, tokens[at:]))
    return torch.cat(out)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def namespace(model) -> Namespace:
    return Namespace(model.fingerprint, model.dtype)


def store(model, cache: PrefixCache, tokens: list[int], snapshots_at: tuple[int, ...] = ()) -> None:
    """Run ``tokens`` from empty, snapshotting at ``snapshots_at`` (and the end), and insert the result."""
    run = model.new_run()
    at = 0
    for mark in (*sorted(snapshots_at), len(tokens)):
        model.forward(run, tokens[at:mark])
        model.snapshot(run)
        at = mark
    cache.insert(namespace(model), tokens, model.export(run))
    model.close_run(run)
    cache.check_invariants()


def restored_logits(model, cache: PrefixCache, query: list[int], pieces=(5, 1, 1, 1)) -> tuple[int, torch.Tensor]:
    """Look ``query`` up, restore the hit, forward the rest: (hit length, logits [len(query) - hit, vocab])."""
    ns = namespace(model)
    match = cache.lookup(ns, query)
    assert match is not None, "expected a cache hit"
    lease = cache.acquire(match, ns)
    run = model.new_run(lease)
    assert run.length == match.length
    try:
        return match.length, forward_pieces(model, run, query[match.length :], pieces)
    finally:
        model.close_run(run)
        cache.release(lease)
