"""chat/cli/bench_options.py: each benchmark and its flags as data; an option's name (where argparse keeps it), its
keyword (what the benchmark's ``main`` receives) and what argparse is given."""

import argparse
import importlib
import inspect

import pytest

from chat.cli import main
from chat.cli.bench_options import BENCHMARKS, BY_NAME, Option


@pytest.mark.parametrize("benchmark", BENCHMARKS, ids=lambda benchmark: benchmark.name)
def test_each_flag_of_a_benchmark_is_a_parameter_of_its_main_and_main_needs_no_other(benchmark):
    parameters = inspect.signature(importlib.import_module(benchmark.module).main).parameters
    given = [option.parameter for option in benchmark.options]
    assert len(set(given)) == len(given) and set(given) <= set(parameters)
    assert all(p.default is not p.empty for name, p in parameters.items() if name not in given)


def test_an_options_name_is_its_dest_else_its_flag_and_its_keyword_defaults_to_the_name():
    plain = Option("--bad-pause-s", "help")
    assert plain.name == plain.parameter == "bad_pause_s"
    renamed = Option("--turns", "help", keyword="quiet_turns")
    assert (renamed.name, renamed.parameter) == ("turns", "quiet_turns")
    stored = Option("--x-y", "help", action="store_false", dest="kept", keyword="given")
    assert (stored.name, stored.parameter) == ("kept", "given")


def test_argparse_is_given_the_help_and_only_the_fields_that_are_set():
    assert Option("--json", "print JSON", action="store_true").argparse_kwargs() == {
        "help": "print JSON",
        "action": "store_true",
    }
    option = Option("--levels", "h", type=int, default=(1,), metavar="N", dest="counts")
    assert option.argparse_kwargs() == {"help": "h", "type": int, "default": (1,), "metavar": "N", "dest": "counts"}
    parser = argparse.ArgumentParser()
    parser.add_argument(option.flag, **option.argparse_kwargs())
    assert getattr(parser.parse_args(["--levels", "3"]), option.name) == 3


def test_benchmarks_are_named_once_and_run_by_their_bench_module():
    assert list(BY_NAME) == [benchmark.name for benchmark in BENCHMARKS]  # no name twice
    assert BY_NAME["http"].module == "chat.tools.bench.http_bench"
    for benchmark in BENCHMARKS:
        flags = [option.flag for option in benchmark.options]
        assert len(set(flags)) == len(flags), benchmark.name
        assert flags[0] == "--json" and benchmark.options[0].parameter == "as_json"


def test_bench_http_runs_its_clients_apart_unless_told_to_keep_them_in_process(monkeypatch):
    got = []
    monkeypatch.setattr("chat.tools.bench.http_bench.main", lambda **kwargs: got.append(kwargs) or 0)
    assert main(["bench", "http", "--json"]) == 0 and main(["bench", "http", "--json", "--clients-in-process"]) == 0
    from chat.tools.bench.http_bench import DEFAULT_ROUNDS

    assert [g["clients_apart"] for g in got] == [True, False] and got[0]["rounds"] == DEFAULT_ROUNDS == 8
    in_process = next(option for option in BY_NAME["http"].options if option.flag == "--clients-in-process")
    assert in_process.name == "clients_in_own_process"  # args holds whether they run in a process of their own
