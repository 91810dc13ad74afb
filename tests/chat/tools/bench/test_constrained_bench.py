import json

from chat.tools.bench.constrained_bench import SCHEMA, compile_schemas, logprob_difference, run

KEYS = {
    "model",
    "date",
    "cpu",
    "conversations",
    "constrained_tokens_per_s",
    "unconstrained_tokens_per_s",
    "constrained_tokens_per_s_ratio",
    "json_valid",
    "json_cut_by_length",
    "grammar_compile_ms",
    "grammar_cached_ms",
    "loglikelihood_requests_per_s",
    "loglikelihood_malformed",
    "logprob_cached_tokens",
    "logprob_max_abs_diff_cache_vs_none",
    "same_tokens",
    "errors",
}


def test_constrained_bench_measures_everything_in_one_run_on_a_tiny_model():
    result = run("tiny-llama", conversations=3, rounds=1, max_tokens=160, schemas=3, loglikelihood_requests=4)
    assert result.keys() >= KEYS
    assert result["errors"] == 0, result["error_samples"]
    assert result["model"] == "tiny-llama" and result["conversations"] == 3
    # a random model's constrained replies that end by themselves all validate: that is what the grammar is for
    assert result["constrained_replies"] - result["json_cut_by_length"] > 0
    assert result["json_valid"] == 1.0
    assert result["logprob_cached_tokens"] > 0
    assert result["logprob_tokens"] > 0 and result["same_tokens"] is True
    assert result["logprob_max_abs_diff_cache_vs_none"] <= 1e-4
    assert result["constrained_tokens_per_s"] > 0 and result["unconstrained_tokens_per_s"] > 0
    assert result["constrained_tokens_per_s_ratio"] == (
        result["constrained_tokens_per_s"] / result["unconstrained_tokens_per_s"]
    )
    # the plain phase asks each conversation for no more than its constrained reply had: the same work, so the
    # ratio is what the grammar costs
    assert 0 < result["unconstrained_completion_tokens"] <= result["constrained_completion_tokens"]
    assert 0 < result["grammar_cached_ms"] < result["grammar_compile_ms"]
    assert result["loglikelihood_requests_per_s"] > 0 and result["loglikelihood_malformed"] == 0
    json.dumps(result, allow_nan=False)  # one plain JSON object


def test_the_compile_schemas_are_distinct_and_differ_from_the_workload_schema():
    schemas = compile_schemas(12)
    texts = {json.dumps(s, sort_keys=True) for s in schemas}
    assert len(texts) == 12 and json.dumps(SCHEMA, sort_keys=True) not in texts
    assert all(s["additionalProperties"] is False and set(s["required"]) == set(s["properties"]) for s in schemas)


def _reply(*tokens):
    content = [
        {
            "token": t,
            "logprob": lp,
            "bytes": list(t.encode()),
            "top_logprobs": [{"token": a, "logprob": v, "bytes": list(a.encode())} for a, v in top],
        }
        for t, lp, top in tokens
    ]
    return {"choices": [{"logprobs": {"content": content}}]}


def test_the_logprob_difference_covers_the_tokens_and_their_alternatives():
    a = _reply(("x", -0.5, [("x", -0.5), ("y", -1.0)]), ("z", -0.1, [("z", -0.1)]))
    b = _reply(("x", -0.5, [("x", -0.5), ("y", -1.25)]), ("z", -0.1, [("z", -0.1)]))
    assert logprob_difference(a, b) == (0.25, True, 2)
    c = _reply(("x", -0.5, [("x", -0.5), ("w", -1.0)]), ("q", -0.1, [("q", -0.1)]))
    assert logprob_difference(a, c)[1] is False


def test_the_cli_registers_the_benchmark():
    from chat.cli import build_parser
    from chat.cli.bench import run_one

    args = build_parser().parse_args(["bench", "constrained", "--json", "--conversations", "3"])
    assert (args.run, args.benchmark, args.json, args.model, args.conversations) == (
        run_one,
        "constrained",
        True,
        "smollm2",
        3,
    )
    args = build_parser().parse_args(["bench", "constrained"])
    assert (args.json, args.conversations) == (False, 8)
