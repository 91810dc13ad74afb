import pytest

from chat.tools.bench.multiturn_bench import MultiTurnConfig, make_workload, message_tokens, run_on, run_workload

CFG = MultiTurnConfig(conversations=3, min_user_tokens=20, max_user_tokens=40, min_reply_tokens=2, max_reply_tokens=4)


@pytest.fixture(scope="module")
def runtime():
    from chat.models import load_model

    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def workload(runtime):
    return make_workload(runtime, CFG)


def test_the_workload_has_four_turns_per_conversation_with_user_messages_in_range(runtime, workload):
    assert len(workload) == 3 and all(len(turns) == 4 for turns in workload)
    for turns in workload:
        for turn in turns:
            assert turn.user_tokens == message_tokens(runtime, turn.user)
            assert 20 <= turn.user_tokens <= 40
            assert 2 <= turn.reply_budget <= 4
    assert len({turn.user for turns in workload for turn in turns}) == 12  # no two messages alike


def test_with_the_cache_later_turns_are_served_from_it_and_without_it_nothing_is(runtime, workload):
    hit, _ = run_workload(runtime, workload, cache=True)
    miss, _ = run_workload(runtime, workload, cache=False)
    for records in (hit, miss):
        assert all(r.error is None for r in records)
        assert sorted((r.conversation, r.turn) for r in records) == [(c, t) for c in range(3) for t in range(4)]
        budgets = {(c, t): turn.reply_budget for c, turns in enumerate(workload) for t, turn in enumerate(turns)}
        assert all(1 <= r.reply_tokens <= budgets[r.conversation, r.turn] for r in records)
    assert all(r.cached_tokens > 0 for r in hit if r.turn > 0)
    assert all(r.cached_tokens == 0 for r in miss)
    # each turn's prompt holds the previous turns: it grows by at least the new user message
    prompts = {(r.conversation, r.turn): r.prompt_tokens for r in hit}
    assert all(prompts[c, t] >= prompts[c, t - 1] + workload[c][t].user_tokens for c in range(3) for t in range(1, 4))


def test_the_summary_reports_per_turn_series_and_totals(runtime):
    result = run_on(runtime, CFG)
    assert result["conversations"] == 3 and result["turns_per_conversation"] == 4 and result["turns"] == 12
    assert result["errors"] == 0 and result["same_replies"] == 1.0
    assert 20 <= result["user_tokens_min"] <= result["user_tokens_max"] <= 40
    hit, miss = result["cached_token_ratio_per_turn_cache"], result["cached_token_ratio_per_turn_nocache"]
    assert len(hit) == len(miss) == 4
    assert all(0 < ratio < 1 for ratio in hit[1:]) and miss == [0.0] * 4
    assert 0 < result["cached_token_ratio"] < 1
    assert len(result["ttft_p50_ms_per_turn_cache"]) == len(result["ttft_p50_ms_per_turn_nocache"]) == 4
    assert result["speedup"] == result["ttft_p50_ms_nocache"] / result["ttft_p50_ms_cache"]
    means = result["prompt_tokens_mean_per_turn"]
    assert means == sorted(means) and means[0] > 20
