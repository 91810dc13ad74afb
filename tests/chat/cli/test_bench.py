"""`turncache bench` (chat/cli/bench.py, chat/cli/bench_options.py): the benchmarks' flags, declared as data, reach
each benchmark's ``main`` under its keywords; the cache benchmark runs for real (it needs no model)."""

import importlib
import inspect
import json

import pytest

from chat.cli import build_parser, main
from chat.cli.bench import run_all, run_one
from chat.cli.bench_options import BENCHMARKS, BY_NAME


@pytest.mark.parametrize("benchmark", BENCHMARKS, ids=lambda benchmark: benchmark.name)
def test_each_flag_of_a_benchmark_is_a_parameter_of_its_main_and_main_needs_no_other(benchmark):
    parameters = inspect.signature(importlib.import_module(benchmark.module).main).parameters
    given = [option.parameter for option in benchmark.options]
    assert len(set(given)) == len(given) and set(given) <= set(parameters)
    assert all(p.default is not p.empty for name, p in parameters.items() if name not in given)


def test_a_benchmark_gets_each_flags_value_under_its_keyword(monkeypatch):
    got = []
    monkeypatch.setattr("chat.tools.bench.tenants_bench.main", lambda **kwargs: got.append(kwargs) or 0)
    assert main(["bench", "tenants", "--turns", "3", "--conversations", "5", "--yield-hold-s", "2.5"]) == 0
    assert got == [
        {
            "as_json": False,
            "model": "smollm2",
            "quiet_turns": 3,
            "noisy_conversations": 5,
            "quiet_priority": None,
            "token_budget": None,
            "yield_budget": None,
            "yield_hold_s": 2.5,
            "threads": None,
        }
    ]


def test_bench_picks_the_suite_without_a_benchmark_and_the_benchmark_named_with_one():
    args = build_parser().parse_args(["bench"])
    assert args.run is run_all and args.benchmark is None
    args = build_parser().parse_args(["bench", "cluster", "--replicas", "3"])
    assert args.run is run_one and BY_NAME[args.benchmark].name == "cluster" and args.replicas == 3


def test_bench_cache_prints_one_json_object_with_the_issue_keys(capsys):
    assert main(["bench", "cache", "--json", "--entries", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "lookup_p99_ms",
        "linear_p99_ms",
        "lookup_speedup",
        "materialize_ms_4k",
        "conversation_bytes_ratio",
        "disk_write_ms_4k",
        "disk_read_ms_4k",
    ):
        assert isinstance(result[key], float) and result[key] > 0
    assert result["entries"] == 200
    assert result["linear_agreement"] == 1.0  # index and linear scan found the same prefix lengths
    assert result["conversation_bytes_ratio"] == pytest.approx(1.0)


def test_bench_cache_table_without_json(capsys):
    assert main(["bench", "cache", "--entries", "50"]) == 0
    out = capsys.readouterr().out
    assert "lookup_p99_ms" in out and not out.lstrip().startswith("{")


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--rounds", "0"], "--rounds"),
        (["--bad-level", "x"], "--bad-level"),
        (["--bad-pause-s", "nan"], "--bad-pause-s"),
    ],
)
def test_bench_http_refuses_bad_settings_naming_the_flag(flags, named, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["bench", "http", "--json", *flags])
    assert refused.value.code == 2 and named in capsys.readouterr().err


def test_bench_http_runs_its_clients_apart_unless_told_to_keep_them_in_process(monkeypatch):
    got = []
    monkeypatch.setattr("chat.tools.bench.http_bench.main", lambda **kwargs: got.append(kwargs) or 0)
    assert main(["bench", "http", "--json"]) == 0 and main(["bench", "http", "--json", "--clients-in-process"]) == 0
    from chat.tools.bench.http_bench import DEFAULT_ROUNDS

    assert [g["clients_apart"] for g in got] == [True, False] and got[0]["rounds"] == DEFAULT_ROUNDS == 8
