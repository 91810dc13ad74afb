"""chat.models.attention's one torch attention body (:func:`attend`) and its causal mask, against the definition:
softmax over the visible rows of (q . k), each query head reading its K/V head, with Gemma's soft cap where given.
Every path is checked: a decoding token (a grouped matmul), a short chunk (matmuls with the mask), a long chunk
(SDPA), and writing into a caller's strided view."""

from __future__ import annotations

import pytest
import torch

from chat.models.attention import MATMUL_QUERY, attend, causal_mask

torch.set_num_threads(1)


def reference(q, k, v, mask, softcap):
    """``q`` [H, n, D] (scaled), ``k`` [Hk, kv, D], ``v`` [Hk, kv, Dv], ``mask`` [n, kv] or None -> [H, n, Dv]."""
    heads, kv_heads = q.shape[0], k.shape[0]
    group = heads // kv_heads
    k = k.double().repeat_interleave(group, dim=0)
    v = v.double().repeat_interleave(group, dim=0)
    scores = q.double() @ k.transpose(1, 2)  # [H, n, kv]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).float()


def test_the_causal_mask_sees_itself_and_what_precedes_within_the_window():
    mask = causal_mask(3, 5, None, torch.device("cpu"))  # the queries are positions 2, 3, 4
    assert mask.tolist() == [[True, True, True, False, False], [True] * 4 + [False], [True] * 5]
    windowed = causal_mask(3, 5, 2, torch.device("cpu"))  # each sees itself and 1 before
    assert windowed.tolist() == [
        [False, True, True, False, False],
        [False, False, True, True, False],
        [False] * 3 + [True] * 2,
    ]


@pytest.mark.parametrize("n", [1, 5, MATMUL_QUERY, MATMUL_QUERY + 7])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("window", [None, 4])
def test_attend_is_the_definition_on_every_path(n, heads, kv_heads, softcap, window):
    torch.manual_seed(n * 100 + heads)
    kv, d, dv = n + 9, 8, 6
    q = torch.randn(heads, n, d) * d**-0.5
    k, v = torch.randn(kv_heads, kv, d), torch.randn(kv_heads, kv, dv)
    mask = None if n == 1 else causal_mask(n, kv, window, q.device)
    got = attend(q, k, v, mask, softcap)
    assert got.shape == (heads, n, dv)
    assert torch.allclose(got, reference(q, k, v, mask, softcap), atol=1e-5)


@pytest.mark.parametrize("n", [1, 3, MATMUL_QUERY + 3])
def test_attend_writes_into_the_callers_strided_view(n):
    """The own decoder hands a [H, n, Dv] view of its [T, H, Dv] output (transposed): the result lands there."""
    torch.manual_seed(n)
    heads, kv_heads, kv, d = 4, 2, n + 5, 8
    q, k, v = torch.randn(heads, n, d), torch.randn(kv_heads, kv, d), torch.randn(kv_heads, kv, d)
    mask = None if n == 1 else causal_mask(n, kv, None, q.device)
    out = torch.full((n + 2, heads, d), float("nan"))  # a step of other sequences around this one
    target = out[1 : 1 + n].transpose(0, 1)
    returned = attend(q, k, v, mask, None, out=target)
    assert torch.allclose(out[1 : 1 + n].transpose(0, 1), reference(q, k, v, mask, None), atol=1e-5)
    assert torch.equal(returned, target)
    assert out[0].isnan().all() and out[-1].isnan().all()  # nothing written outside the view
