"""`turncache bench agent` on tiny models: its keys, no errors, valid calls, and the cache ratios it reports."""

from chat.tools.bench.agent_bench import TARGETS, run


def test_agent_bench_reports_valid_calls_and_cache_ratios():
    result = run("tiny-llama", loops=2, steps=3, max_tokens=200, claude_code_size=(2, 20))  # a ~2k-token prefix
    assert set(TARGETS) <= set(result) and result["errors"] == 0
    assert result["tool_calls"] >= 4  # the first step of each loop must call
    assert result["tool_calls_valid"] == 1.0  # every call constrained to its schema, even from random weights
    assert result["messages_tool_calls"] >= 2 and result["messages_tool_calls_valid"] == 1.0  # /v1/messages
    for key in (
        "cached_ratio_after_tool",
        "cached_ratio_responses",
        "cached_ratio_messages",
        "cached_ratio_after_thinking",
        "cached_ratio_cross_session",  # a new Claude Code session's first step (another billing line)
    ):
        assert 0.5 < result[key] <= 1.0, (key, result[key])
    # every step of the thinking loops finds all it can in the cache: the whole history before its new question (the
    # answer too, whose tokens the model never wrote in that form: its thinking went ahead of it)
    assert 0.5 < result["reusable_ratio_after_thinking"] <= result["cached_ratio_after_thinking"] + 0.005
    assert result["pinned_hit_after_flood"] == 1.0 and result["flood_bytes_over_budget"] >= 4
    assert result["flood_evictions"] > 0  # the flood did push entries out: the pinned prefix outlived it
