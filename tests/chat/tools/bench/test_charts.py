"""chat/tools/bench/charts.py: each chart drawn from its benchmark's keys in a saved result, and skipped when that
benchmark is missing or failed (the whole suite's charts from real figures: test_suite.py)."""

from PIL import Image

from chat.tools.bench.charts import CHARTS, concurrent_ttft, draw_all, lookup_vs_entries

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RESULTS = {
    "multiturn": {
        "model": "tiny-llama",
        "conversations": 2,
        "ttft_p50_ms_per_turn_cache": [30.0, 12.0, 11.0],
        "ttft_p50_ms_per_turn_nocache": [30.0, 40.0, 55.0],
        "cached_token_ratio_per_turn_cache": [0.0, 0.8, 0.9],
        "cached_token_ratio_per_turn_nocache": [0.0, 0.0, 0.0],
    },
    "cache": {
        "mean_entry_tokens": 2000,
        "scaling_entries": [10, 100, 1000],
        "scaling_lookup_p50_ms": [0.01, 0.02, 0.03],
        "scaling_lookup_p99_ms": [0.02, 0.03, 0.05],
        "scaling_linear_p99_ms": [0.1, 1.0, 10.0],
    },
    "serve": {"sessions": 8, "ttft_ms_samples": [10.0, 12.0, 30.0]},
    "load": {"sessions": 32, "ttft_ms_samples": [20.0, 25.0, 90.0]},
    "batch": {
        "model": "tiny-llama",
        "weights": "float32",
        "levels": [1, 2, 4],
        "aggregate_tokens_per_s": [50.0, 90.0, 150.0],
        "single_stream_tokens_per_s": 48.0,
        "hf_generate_tokens_per_s": 30.0,
    },
}


def test_every_chart_is_drawn_as_a_png_from_its_benchmarks_keys(tmp_path):
    written = draw_all(RESULTS, tmp_path / "charts")  # the folder is made
    assert [p.name for p in written] == [name for name, _ in CHARTS]
    for path in written:
        assert path.read_bytes().startswith(PNG_MAGIC)
        with Image.open(path) as image:
            assert image.size == (640, 400)


def test_charts_are_skipped_when_their_benchmark_failed(tmp_path):
    assert draw_all({"multiturn": {"error": "x"}, "cache": {"error": "x"}}, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_a_chart_needs_its_own_keys_and_the_box_plot_any_of_its_two_benchmarks(tmp_path):
    assert not lookup_vs_entries({"cache": {"mean_entry_tokens": 10}}, tmp_path / "a.png")  # an older cache result
    assert not concurrent_ttft({"serve": {"sessions": 8, "ttft_ms_samples": []}}, tmp_path / "b.png")
    assert concurrent_ttft({"load": RESULTS["load"]}, tmp_path / "c.png") and (tmp_path / "c.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png"]
