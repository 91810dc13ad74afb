"""chat/tools/bench/chat_profile.py: the worker's time by stage with the nested timers taken apart, and the medians
of a turn's path; one real profile on tiny-llama."""

from types import SimpleNamespace

import pytest

from chat.tools.bench.chat_profile import engine_stages, timeline


@pytest.mark.slow
def test_the_chat_profile_accounts_for_the_workers_time_stage_by_stage():
    from chat.models import load_model
    from chat.tools.bench.chat_profile import profile

    result = profile(load_model("tiny-llama"), 2, turns=2, reply_tokens=8)
    assert result["turns"] == 4 and result["errors"] == 0 and result["tokens"] > 0
    stages = result["engine_ms_per_turn"]
    assert all(v >= 0 for v in stages.values()), stages  # nested timers taken apart, none counted twice
    assert stages["prefill_forward"] > 0 and stages["decode_forward"] > 0 and stages["tokenize"] > 0
    busy_s = (sum(stages.values()) - stages["idle"]) * result["turns"] / 1e3
    assert 0 < busy_s <= result["wall_s"] * 1.05  # the worker's own time: never more than the run's
    path = result["timeline_ms"]
    assert path["ttft_server"] >= path["prefill"] > 0 and path["total"] >= path["decode"]


TIMERS = {
    "render_prompt": 5.0,  # the tokenizer runs inside the template's render
    "tokenize": 2.0,
    "lookup": 0.5,
    "acquire": 0.25,
    "restore": 1.0,
    "miss_reason": 0.25,
    "admission": 10.0,  # holds the five above
    "prefill_forward": 20.0,
    "decode_forward": 30.0,
    "insert": 3.0,
    "release": 1.0,
    "step": 60.0,  # holds the forwards, the inserts and the releases
    "deliver": 4.0,
    "admit_waiting": 100.0,  # holds admission: the rest is idle
}


def test_engine_stages_take_the_nested_timers_apart_so_that_they_add_up_to_the_outer_ones():
    stages = engine_stages(TIMERS)
    assert stages["render"] == 3.0 and stages["tokenize"] == 2.0
    assert stages["admission_other"] == 10.0 - (5.0 + 0.5 + 0.25 + 1.0 + 0.25)
    assert stages["step_other"] == 60.0 - 50.0 - 3.0 - 1.0
    assert stages["idle"] == 90.0
    outer = TIMERS["admit_waiting"] + TIMERS["step"] + TIMERS["deliver"]
    assert sum(stages.values()) == pytest.approx(outer)  # every second counted once


def _record(start: float, tokens: bool = True) -> dict:
    """A request's stamps (s): 1 ms to submit, 1 ms queued, 1 ms admitted, prefill 4..8 ms, first token at 10 ms,
    its write at 12, last token at 30, last byte at 31; ``tokens=False``: the turn made none."""
    clock = SimpleNamespace(
        prefill_start=start + 0.004,
        prefill_end=start + 0.008,
        first_token=start + 0.010 if tokens else None,
        last_token=start + 0.030,
    )
    stamps = {"submit": 0.001, "admit_start": 0.002, "admit_end": 0.003, "first_write": 0.012, "end": 0.031}
    return {"start": start, **{k: start + v for k, v in stamps.items()}, "turn": SimpleNamespace(clock=clock)}


def test_the_timeline_is_each_stages_median_in_ms_over_the_finished_turns():
    slow = _record(5.0)
    slow["start"] -= 0.008  # a slow parse: the median of 1, 1 and 9 ms is 1
    unfinished = _record(9.0)
    del unfinished["end"]
    records = [_record(1.0), _record(2.0), slow, unfinished, _record(3.0, tokens=False)]
    path = timeline(records)
    assert path["parse_validate"] == pytest.approx(1.0)
    assert path["queue"] == pytest.approx(1.0) and path["admission"] == pytest.approx(1.0)
    assert path["prefill"] == pytest.approx(4.0) and path["first_token"] == pytest.approx(2.0)
    assert path["first_write"] == pytest.approx(2.0) and path["decode"] == pytest.approx(20.0)
    assert path["ttft_server"] == pytest.approx(12.0) and path["total"] == pytest.approx(31.0)
    assert timeline([unfinished]) == {}
