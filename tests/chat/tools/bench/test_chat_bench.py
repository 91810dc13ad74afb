import json

import pytest

from chat.cli import main as cli_main
from chat.tools.bench.chat_bench import ChatRun, conversations, summary, targets_met

KEYS = {
    "levels",
    "engine_tokens_per_s",
    "http_tokens_per_s",
    "ws_tokens_per_s",
    "http_no_disk_tokens_per_s",
    "decode_only_tokens_per_s",
    "chat_ratio_http",
    "chat_ratio_ws",
    "engine_chat_efficiency",
    "ttft_p50_ms",
    "tokens_per_s_by_round",
    "cached_ratio",
    "disk_tier_cost",
    "disk_tier_ttft_ratio",
    "client_cpu_share",
    "errors",
    "rounds",
}


@pytest.mark.slow
def test_bench_chat_prints_one_json_object_with_every_key_measured(capsys):
    args = ["bench", "chat", "--json", "--model", "tiny-llama", "--levels", "2", "--rounds", "1", "--turns", "2"]
    assert cli_main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == KEYS and result["levels"] == [2] and result["errors"] == 0 and result["rounds"] == 1
    for key in ("engine", "http", "ws", "http_no_disk", "decode_only"):
        assert len(result[f"{key}_tokens_per_s"]) == 1 and all(v > 0 for v in result[f"{key}_tokens_per_s"]), key
        assert all(v > 0 for v in result["ttft_p50_ms"][key]), key
    http, engine = result["http_tokens_per_s"][0], result["engine_tokens_per_s"][0]
    assert result["chat_ratio_http"][0] == http / engine  # one round: its own ratio
    assert result["disk_tier_cost"][0] == 1 - http / result["http_no_disk_tokens_per_s"][0]
    assert all(0.3 < r < 1 for r in result["cached_ratio"])  # the second turn's prompt is mostly the first's
    assert 0 < result["client_cpu_share"] < 1


def test_the_conversations_differ_and_their_messages_are_about_forty_words():
    convs = conversations(8, 4)
    assert len({c[1]["content"] for c in convs}) == 8
    for conv in convs:
        assert conv[0]["role"] == "system" and [m["role"] for m in conv[1:]] == ["user"] * 4
        assert all(30 <= len(m["content"].split()) <= 50 for m in conv[1:])


def test_the_summary_pairs_ratios_by_round_and_the_disk_cost_is_one_minus_with_over_without(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    run = lambda rate, ttft=100.0, cpu=0.0: ChatRun(rate, ttft, 0, 2.0, 100, 80, cpu)  # noqa: E731
    results = {
        "engine": [[run(100), run(200)]],
        "http": [[run(90, 110, 1.0), run(90, 120, 1.0)]],
        "ws": [[run(80), run(180)]],
        "http_no_disk": [[run(100, 100), run(100, 100)]],
        "decode_only": [[run(200), run(250)]],
    }
    result = summary((8,), results)
    assert result["chat_ratio_http"] == [(0.9 + 0.45) / 2] and result["chat_ratio_ws"] == [(0.8 + 0.9) / 2]
    assert result["engine_chat_efficiency"] == [(0.5 + 0.8) / 2]
    assert result["disk_tier_cost"] == [pytest.approx(0.1)]
    assert result["disk_tier_ttft_ratio"] == [pytest.approx(1.15)]
    assert result["cached_ratio"] == [0.8] and result["client_cpu_share"] == 2.0 / (6 * 2.0 * 2)
    assert result["tokens_per_s_by_round"]["ws"] == [[80, 180]]  # every round's rate, in the order they ran
    met = targets_met({**result, "errors": 0})
    assert met["chat_ratio_http at 8 >= 0.85"] is False and met["disk_tier_cost at 8 <= 0.05"] is False
    assert met["ttft_p50_ms http at 8 <= 300"] is True
