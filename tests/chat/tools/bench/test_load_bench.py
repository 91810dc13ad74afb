from chat.tools.bench.load_bench import run_on
from tests.chat.engine.fakes import FakeRuntime


def test_load_bench_reports_throughput_latency_and_memory_from_a_real_run():
    result = run_on(FakeRuntime(delay_s=0.001), sessions=6, turns=2, short_tokens=8, cache_mib=1)
    assert result["sessions"] == 6 and result["turns"] == 12 and result["errors"] == 0
    assert result["turns_per_s"] > 0 and result["completion_tokens_per_s"] > 0
    assert 0 < result["ttft_p50_ms"] <= result["ttft_p99_ms"]
    assert 0 < result["rss_before_mib"] <= result["rss_peak_mib"]
    assert result["cache_bytes_after_mib"] <= result["cache_budget_mib"]
