import json
from pathlib import Path

from PIL import Image

from chat.cli import build_parser
from chat.cli.bench import run_all as run_the_suite
from chat.cli.bench import run_one
from chat.tools.bench import suite
from chat.tools.bench.charts import CHARTS
from chat.tools.bench.suite import Suite, run_all

SMALL = {
    "cache": {"entries": 200, "queries": 50, "linear_queries": 5, "scaling_queries": 20, "scaling_linear_queries": 3},
    "turns": {"turns": 3, "reply_tokens": 6, "decode_tokens": 4, "repeats": 1},
    "media_turns": {"turns": 3, "reply_tokens": 4, "decode_tokens": 3, "repeats": 1, "session_turns": 2},
    "multiturn": {"conversations": 2, "min_user_tokens": 16, "max_user_tokens": 32, "max_reply_tokens": 4},
    "serve": {"sessions": 2, "turns": 2, "short_tokens": 4, "long_tokens": 24, "probes": 2},
    "load": {"sessions": 3, "turns": 2, "short_tokens": 4, "cache_mib": 16},
    "batch": {"levels": (1, 2), "reply_tokens": 4},
}
# the keys each benchmark documents (their interface), plus the series the charts read
KEYS = {
    "cache": ["lookup_p99_ms", "linear_p99_ms", "lookup_speedup", "materialize_ms_4k", "conversation_bytes_ratio",
              "scaling_entries", "scaling_lookup_p50_ms", "scaling_lookup_p99_ms", "scaling_linear_p99_ms"],
    "turns": ["ttft_hit_ms", "ttft_miss_ms", "ttft_floor_ms", "hf_reprefill_ms", "hit_speedup", "overhead_ratio",
              "decode_tps", "hf_decode_tps", "decode_ratio"],
    "media_turns": ["ttft_hit_ms", "ttft_miss_ms", "hit_speedup", "decode_ratio", "media_items", "media_repeated",
                    "encoder_skipped"],
    "multiturn": ["ttft_p50_ms_cache", "ttft_p50_ms_nocache", "speedup", "cached_token_ratio", "turns",
                  "conversations", "ttft_p50_ms_per_turn_cache", "ttft_p50_ms_per_turn_nocache",
                  "cached_token_ratio_per_turn_cache", "cached_token_ratio_per_turn_nocache"],
    "serve": ["sessions", "turns", "errors", "ttft_p50_ms", "ttft_p99_ms", "cached_ratio", "ttft_idle_p50_ms",
              "ttft_contended_p50_ms", "ttft_contended_ratio", "wall_s", "ttft_ms_samples"],
    "load": ["sessions", "turns", "errors", "turns_per_s", "completion_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
             "rss_before_mib", "rss_peak_mib", "rss_after_mib", "rss_growth_mib", "cache_bytes_after_mib",
             "ttft_ms_samples"],
    "batch": ["levels", "aggregate_tokens_per_s", "ttft_p50_ms", "single_stream_tokens_per_s",
              "single_stream_spec_tokens_per_s", "hf_generate_tokens_per_s", "weights", "errors"],
}  # fmt: skip
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_bench_all_writes_one_json_with_every_benchmark_and_valid_png_charts(tmp_path):
    results = run_all(Suite(model="tiny-llama", sizes=SMALL), tmp_path, log=lambda msg: None)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert [name for name, _ in suite.BENCHMARKS] == list(KEYS)
    for name, keys in KEYS.items():
        assert "error" not in saved[name], saved[name]
        assert set(keys) <= saved[name].keys(), set(keys) - saved[name].keys()
        assert saved["elapsed_s"][name] > 0 and saved["rss_before_mib"][name] > 0
    assert saved["cache"]["entries"] == 200 and saved["cache"]["scaling_entries"][-1] == 200
    assert saved["multiturn"]["model"] == saved["serve"]["model"] == "tiny-llama"
    assert saved["serve"]["errors"] == saved["load"]["errors"] == saved["multiturn"]["errors"] == 0
    assert saved["batch"]["errors"] == 0 and saved["batch"]["levels"] == [1, 2]
    machine = saved["machine"]
    for key in ("cpu_model", "cores", "torch", "transformers", "date"):
        assert machine[key], key
    assert [Path(p).name for p in results["charts"]] == [name for name, _ in CHARTS]
    for name, _ in CHARTS:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        with Image.open(tmp_path / name) as image:
            image.verify()
        with Image.open(tmp_path / name) as image:
            assert image.size[0] >= 300 and image.size[1] >= 200


def test_a_failing_benchmark_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(s):
        raise RuntimeError("boom")

    monkeypatch.setattr(suite, "BENCHMARKS", (("broken", broken), ("fine", lambda s: {"x": 1.0})))
    results = run_all(Suite(), tmp_path, log=lambda msg: None)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["broken"] == {"error": "RuntimeError: boom"} and saved["fine"] == {"x": 1.0}
    assert suite.failed(results) == ["broken"]
    assert results["charts"] == []  # no benchmark behind any chart: nothing drawn
    assert suite.main(tmp_path) == 1


def test_bench_without_a_benchmark_runs_them_all_and_multiturn_is_a_benchmark():
    args = build_parser().parse_args(["bench"])
    assert args.run is run_the_suite and args.out == Path("bench-results") and args.all_model == "smollm2"
    args = build_parser().parse_args(["bench", "--out", "x", "--model", "tiny-llama", "--json"])
    assert args.out == Path("x") and args.all_model == "tiny-llama" and args.all_json
    args = build_parser().parse_args(["bench", "multiturn", "--conversations", "2", "--json"])
    assert args.run is run_one and args.benchmark == "multiturn" and args.conversations == 2 and args.json
