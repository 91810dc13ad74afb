"""chat/tools/bench/media_session.py: a session of one new photo per turn through a WebSocket turn's path, timed per
turn (run on a tiny multimodal model; the same figures inside ``bench turns``: test_turns_bench.py)."""

import pytest
import torch

from chat.tools.bench import media_session


@pytest.fixture(scope="module")
def runtime():
    from chat.models import load_model

    torch.set_num_threads(1)
    return load_model("tiny-qwen3vl")


def test_each_turn_reports_its_request_render_and_first_token_times_and_the_model_is_left_as_it_was(runtime):
    out = media_session.run(runtime, turns=2)
    assert out["session_turns"] == 2 and out["session_photo_kib"] > 100  # phone-photo sized
    for key in ("request_ms_per_turn", "render_ms_per_turn", "ttft_ms_per_turn"):
        assert len(out[key]) == 2 and all(ms > 0 for ms in out[key]), key
    assert all(r < t for r, t in zip(out["render_ms_per_turn"], out["ttft_ms_per_turn"], strict=True))
    assert "render_prompt" not in vars(runtime)  # the timer wrapped this instance for the session only


def test_the_timer_is_removed_when_a_turn_fails(runtime, monkeypatch):
    def refuse(turn):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr("chat.engine.turn.run_to_end", refuse)
    with pytest.raises(RuntimeError, match="the engine broke"):
        media_session.run(runtime, turns=1)
    assert "render_prompt" not in vars(runtime)
