"""chat.engine.metrics: what a finished turn and a scheduler step add to the counters and the TTFT histogram."""

from __future__ import annotations

from chat.engine.events import Done, Timings, Usage
from chat.engine.metrics import TTFT_BUCKETS_S, Metrics
from chat.engine.scheduler import StepReport
from chat.server.metrics_text import render_metrics


def done(finish: str = "stop", prompt: int = 10, cached: int = 4, completion: int = 3, ttft_ms: float = 30.0) -> Done:
    return Done("x", (1,) * completion, finish, Usage(prompt, cached, completion), Timings(ttft_ms, 1.0, 2.0, 50.0))


def test_a_finished_turn_adds_its_tokens_its_finish_reason_and_its_time_to_first_token():
    metrics = Metrics()
    for _ in range(2):
        metrics.turn_started()
    metrics.turn_done(done())
    assert (metrics.active, metrics.turns) == (1, 1)
    metrics.turn_done(done("length", prompt=6, cached=0, completion=5, ttft_ms=250.0))
    assert (metrics.active, metrics.turns) == (0, 2)
    assert (metrics.prompt_tokens, metrics.cached_tokens, metrics.completion_tokens) == (16, 4, 8)
    assert metrics.finish_reasons == {"stop": 1, "length": 1}
    assert metrics.hit_rate == 4 / 16
    assert abs(metrics.ttft_sum_s - 0.28) < 1e-9
    buckets = [0] * (len(TTFT_BUCKETS_S) + 1)
    buckets[TTFT_BUCKETS_S.index(0.05)] += 1  # 30 ms: in the 50 ms bucket
    buckets[TTFT_BUCKETS_S.index(0.25)] += 1  # 250 ms: on a bound, in that bound's bucket (le)
    assert metrics.ttft_buckets == buckets


def test_a_turn_that_generated_nothing_has_no_time_to_first_token_and_a_slow_one_lands_in_inf():
    metrics = Metrics()
    metrics.turn_started()
    metrics.turn_done(done("cancelled", completion=0, ttft_ms=5.0))
    assert metrics.ttft_buckets == [0] * (len(TTFT_BUCKETS_S) + 1) and metrics.ttft_sum_s == 0.0
    assert metrics.finish_reasons == {"cancelled": 1} and metrics.turns == 1
    metrics.turn_done(done(ttft_ms=60_000.0))
    assert metrics.ttft_buckets[-1] == 1  # past the last bound: +Inf


def test_steps_count_turns_and_tokens_and_an_empty_step_counts_nothing():
    metrics = Metrics()
    metrics.step_done(None)
    metrics.step_done(StepReport(turns=0, tokens=0, prefills=0))
    assert (metrics.steps, metrics.steps_interrupted) == (0, 0)
    metrics.step_done(StepReport(turns=3, tokens=9, prefills=1))
    metrics.step_done(StepReport(turns=1, tokens=1, prefills=0))
    assert (metrics.steps, metrics.step_turns, metrics.step_tokens) == (2, 4, 10)
    metrics.turn_paused()
    assert metrics.turn_pauses == 1


def test_the_hit_rate_of_no_prompt_is_zero():
    assert Metrics().hit_rate == 0.0


def test_an_interrupted_step_is_counted_apart_from_the_steps_that_computed():
    metrics = Metrics()
    metrics.step_done(StepReport(turns=3, tokens=9, prefills=1))
    metrics.step_done(StepReport(turns=2, tokens=2, prefills=0, interrupted=True))
    assert (metrics.steps, metrics.step_tokens, metrics.steps_interrupted) == (1, 9, 1)
    lines = render_metrics(metrics, None).splitlines()
    assert "turncache_steps_total 1" in lines and "turncache_steps_interrupted_total 1" in lines
