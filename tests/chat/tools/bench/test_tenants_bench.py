import json

import pytest

from chat.cli import build_parser
from chat.cli.bench import run_one
from chat.tools.bench.tenants_bench import (
    TARGETS,
    TenantsConfig,
    TenantsSettingError,
    batch_settings,
    held_rows,
    keys_file,
    main,
)

# big enough a noisy workload that the quiet tenant's share (half the budget) holds its two sessions' latest entries
# and the one a turn is writing: a random model's replies do not re-tokenize as generated, so each turn writes anew
SMALL = dict(
    quiet_turns=3,
    quiet_reply_tokens=4,
    think_s=0.0,
    noisy_conversations=12,
    noisy_turns=3,
    noisy_user_tokens=320,
    noisy_reply_tokens=4,
    noisy_concurrent_turns=2,
)
KEYS = {"quiet_ttft_p50_ratio", "quiet_cached_ratio", "noisy_tokens_per_s", "rate_limited", "errors"}


def test_the_json_path_runs_both_tenants_end_to_end_on_a_tiny_model(capsys, monkeypatch):
    monkeypatch.setattr("chat.tools.bench.tenants_bench.TenantsConfig", lambda **given: TenantsConfig(**SMALL | given))
    assert main(as_json=True, model="tiny-llama", quiet_priority=-10, threads=1) == 0
    result = json.loads(capsys.readouterr().out)  # one JSON object on stdout, nothing else
    assert result.keys() >= KEYS | set(TARGETS)
    assert result["errors"] == 0, result["error_samples"]
    assert result["model"] == "tiny-llama" and result["retry_after"] == "honoured"
    # twelve workers over a limit of two concurrent turns: refused with 429, which is not an error
    assert result["rate_limited"] > 0 and result["noisy_turns_done"] > 0 and result["noisy_tokens_per_s"] > 0
    # the budget is sized from the workload: B's conversations hold it 4 times, A's sessions fit in their share
    assert result["noisy_cache_fills_planned"] == 4.0 and result["noisy_cache_fills"] > 0
    assert result["quiet_cache_mib_planned"] <= result["tenant_share"] * result["cache_budget_mib"]
    # A keeps its cached prefixes under B's load, as much as alone (a random model's replies do not re-tokenize to
    # the tokens it generated, so only the earlier prompts are reused: the ratio of this shape is about 0.7)
    assert result["quiet_cached_ratio"] >= 0.6
    assert result["quiet_cached_ratio"] >= 0.95 * result["quiet_cached_ratio_alone"]
    assert result["quiet_cached_ratio_no_priority"] >= 0.95 * result["quiet_cached_ratio_alone"]
    assert result["quiet_ttft_p50_ratio"] == result["quiet_ttft_p50_ms_loaded"] / result["quiet_ttft_p50_ms_alone"]
    assert result["quiet_ttft_p50_ms_loaded_no_priority"] > 0
    assert (result["token_budget"], result["yield_budget"], result["yield_hold_s"]) == (256, 16, 10.0)  # the server's
    assert result["threads"] == 1


def test_the_keys_file_limits_the_noisy_tenant_and_gives_the_quiet_one_its_priority(tmp_path):
    from chat.server.tenancy.auth import read_keys_file

    path = tmp_path / "keys.json"
    cfg = TenantsConfig(noisy_concurrent_turns=3, quiet_priority=-7)
    keys_file(path, cfg, priority=True)
    found = read_keys_file(str(path))
    assert sorted(found.keys.values()) == ["noisy", "quiet"]
    assert found.policies["noisy"].limits.concurrent_turns == 3 and found.policies["quiet"].priority == -7
    keys_file(path, cfg, priority=False)
    assert "quiet" not in read_keys_file(str(path)).policies


def test_held_rows_are_whole_buffers():
    assert [held_rows(n) for n in (1, 256, 257, 700)] == [256, 256, 512, 768]


def test_the_cli_registers_the_benchmark():
    args = build_parser().parse_args(["bench", "tenants", "--json", "--turns", "3", "--conversations", "5"])
    assert args.run is run_one and args.benchmark == "tenants" and args.json and args.model == "smollm2"
    assert (args.turns, args.conversations, args.quiet_priority, args.token_budget) == (3, 5, None, None)
    assert (args.yield_budget, args.yield_hold_s, args.threads) == (None, None, None)
    given = build_parser().parse_args(["bench", "tenants", "--yield-budget", "0", "--yield-hold-s", "2.5"])
    assert (given.yield_budget, given.yield_hold_s) == (0, 2.5)


def test_the_scheduler_settings_given_reach_the_server_and_the_others_are_its_defaults():
    default = batch_settings(TenantsConfig())
    assert (default.token_budget, default.yield_budget, default.yield_hold_s) == (256, 16, 10.0)
    given = batch_settings(TenantsConfig(token_budget=64, yield_budget=0, yield_hold_s=1.5))
    assert (given.token_budget, given.yield_budget, given.yield_hold_s) == (64, 0, 1.5)


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ({"quiet_turns": 0}, "quiet_turns"),
        ({"noisy_conversations": -3}, "noisy_conversations"),
        ({"quiet_priority": 101}, "quiet_priority"),
        ({"token_budget": 8}, "token_budget"),
        ({"yield_budget": 1}, "yield_budget"),
        ({"yield_hold_s": -1.0}, "yield_hold_s"),
        ({"threads": 0}, "threads"),
        ({"tenant_share": 1.5}, "tenant_share"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_setting(given, name):
    with pytest.raises(TenantsSettingError) as refused:
        TenantsConfig(**given)
    assert refused.value.name == name and str(refused.value).startswith(name)


def test_the_cli_names_the_flag_of_a_setting_out_of_range():
    with pytest.raises(SystemExit, match="--conversations: noisy_conversations: must be an integer >= 1"):
        main(as_json=True, model="tiny-llama", noisy_conversations=0)
