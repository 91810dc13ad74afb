import pytest

from chat.tools.bench.restart_bench import TARGETS, run


@pytest.mark.slow
def test_restart_bench_reports_every_key_from_a_real_run(tmp_path):
    result = run("tiny-llama", turns=2, reply_tokens=6, workdir=tmp_path)
    assert set(TARGETS) <= set(result)
    assert result["restart_s"] > 0 and result["disk_bytes"] > 0 and result["disk_reads_after_restart"] >= 1
    assert min(result["ttft_warm_ms"], result["ttft_after_restart_ms"], result["ttft_cold_ms"]) > 0
    # the resumed turn reuses what the same turn reuses without a restart, and answers the same
    assert result["cached_tokens_after_restart"] == result["cached_tokens_warm"] > 0
    assert result["same_reply"] is True
    assert result["cached_ratio_after_restart"] == result["cached_tokens_after_restart"] / result["prefix_tokens"]
