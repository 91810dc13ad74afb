from chat.tools.bench.batch_bench import prompts, run, targets_met


def test_the_prompts_are_all_different_questions():
    asked = [m[0]["content"] for m in prompts(32)]
    assert len(set(asked)) == 32 and all(m.endswith(".)") for m in asked)


def test_batch_bench_measures_every_level_and_the_baselines_in_one_run():
    result = run("tiny-llama", levels=(1, 3), reply_tokens=5, max_batch=2, token_budget=32, rounds=2)
    assert result["levels"] == [1, 3] and len(result["aggregate_tokens_per_s"]) == 2 and result["errors"] == 0
    assert result["rounds"] == 2
    assert all(r > 0 for r in result["aggregate_tokens_per_s"]) and all(t > 0 for t in result["ttft_p50_ms"])
    assert result["single_stream_tokens_per_s"] > 0 and result["single_stream_spec_tokens_per_s"] > 0
    assert result["hf_generate_tokens_per_s"] > 0
    assert (result["max_batch"], result["token_budget"], result["weights"]) == (2, 32, "float32")


def test_the_targets_are_read_from_the_result():
    result = {
        "levels": [1, 8],
        "aggregate_tokens_per_s": [10.0, 49.0],
        "single_stream_tokens_per_s": 30.0,
        "hf_generate_tokens_per_s": 10.0,
        "errors": 0,
    }
    assert targets_met(result) == {
        "errors == 0": True,
        "aggregate at 8 >= 5 x aggregate at 1": False,
        "single stream >= 3 x hf generate": True,
    }
