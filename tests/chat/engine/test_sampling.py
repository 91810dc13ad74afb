"""The sampler on its own: extreme temperatures, top-k/top-p cuts, seeds; the stop-string matcher."""

from __future__ import annotations

import pytest
import torch

from chat.engine.sampling import SamplingParams, StopMatcher, greedy, sample


def _logits() -> torch.Tensor:
    return torch.tensor([0.5, 3.0, -1.0, 2.9, 0.0])


@pytest.mark.parametrize("temperature", [3.86e-48, 1e-30, 1e-8])
def test_a_tiny_temperature_picks_the_argmax_without_error(temperature):
    params = SamplingParams(temperature=temperature, seed=1)
    picks = {sample(_logits(), params, params.generator()) for _ in range(20)}
    assert picks == {1}


def test_huge_logits_do_not_overflow():
    logits = torch.tensor([3e38, -3e38, 1e38])
    params = SamplingParams(temperature=0.01, seed=0)
    assert sample(logits, params, params.generator()) == 0


def test_all_minus_inf_falls_back_to_greedy_instead_of_raising():
    logits = torch.full((4,), float("-inf"))
    params = SamplingParams(temperature=1.0, seed=0)
    assert sample(logits, params, params.generator()) in range(4)


def test_top_k_one_is_greedy_at_any_temperature():
    params = SamplingParams(temperature=5.0, top_k=1, seed=3)
    assert {sample(_logits(), params, params.generator()) for _ in range(20)} == {1}


def test_top_p_keeps_only_the_smallest_set_reaching_the_mass():
    logits = torch.tensor([10.0, 9.0, -10.0, -10.0])  # the first two hold ~all the mass
    params = SamplingParams(temperature=1.0, top_p=0.5, seed=5)
    assert {sample(logits, params, params.generator()) for _ in range(30)} == {0}
    params = SamplingParams(temperature=1.0, top_p=0.99, seed=5)
    gen = params.generator()
    assert {sample(logits, params, gen) for _ in range(200)} == {0, 1}


def test_the_same_seed_gives_the_same_draws():
    params = SamplingParams(temperature=2.0, seed=42)
    draws = [[sample(_logits(), params, g) for _ in range(30)] for g in (params.generator(), params.generator())]
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1  # at temperature 2 it really samples


@pytest.mark.parametrize(
    "values",
    [[0.5, 3.0, 3.0, -1.0], [float("-inf")] * 3, [1.0, float("nan"), 5.0, float("nan")], [-2.0]],
    ids=["ties", "all-inf", "nan", "one"],
)
def test_greedy_is_torch_argmax_first_of_equals_and_nan(values):
    row = torch.tensor(values)
    assert greedy(row) == int(torch.argmax(row))
    assert greedy(row.double()) == int(torch.argmax(row.double()))  # not float32: through torch


def test_greedy_reads_a_strided_row_where_it_lies():
    logits = torch.randn(5, 300)
    logits[2, 177] = 99.0
    assert greedy(logits[:, 7]) == int(torch.argmax(logits[:, 7])) and greedy(logits[2]) == 177


def test_stop_matcher_cuts_at_the_earliest_stop_in_one_push():
    matcher = StopMatcher(["b", "abc"])
    assert matcher.push("xabc") == ("x", True)
    held = StopMatcher(["END"])
    assert held.push("the EN") == ("the ", False)
    assert held.push("D!") == ("", True)
