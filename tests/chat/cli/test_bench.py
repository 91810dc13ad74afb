"""`turncache bench` (chat/cli/bench.py): the subparsers built from the benchmarks' options, each flag's value
reaching the benchmark's ``main`` under its keyword, the suite without a benchmark. The options themselves:
test_bench_options.py; each benchmark's figures: tests/chat/tools/bench."""

import pytest

from chat.cli import build_parser, main
from chat.cli.bench import run_all, run_one
from chat.cli.bench_options import BY_NAME


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
