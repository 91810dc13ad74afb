from chat.tools.bench.serve_bench import run_on
from tests.chat.engine.fakes import FakeRuntime


def test_serve_bench_reports_every_key_from_a_real_run():
    runtime = FakeRuntime(script=lambda p: "word " * 60, delay_s=0.002)
    result = run_on(runtime, sessions=3, turns=3, short_tokens=8, long_tokens=60, probes=3)
    assert result["sessions"] == 3 and result["turns"] == 9 and result["errors"] == 0
    assert 0 < result["cached_ratio"] < 1
    assert 0 < result["ttft_p50_ms"] <= result["ttft_p99_ms"]
    assert result["ttft_contended_ratio"] == result["ttft_contended_p50_ms"] / result["ttft_idle_p50_ms"]
