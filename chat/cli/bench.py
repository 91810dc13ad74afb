"""`turncache bench [NAME]`: every benchmark in one process (the suite), or one of them.

The benchmarks and their flags are data in ``chat/cli/bench_options.py``; this module makes their subparsers and
runs one by calling its ``main`` with a keyword per flag. With --json, standard output carries the JSON object alone.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
from pathlib import Path

from chat.cli.bench_options import BENCHMARKS, BY_NAME, Benchmark


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmarks that print measured figures",
        description="With no BENCHMARK: run cache, turns, media_turns (bench turns on tiny-omni, with images, "
        "audio and video), multiturn, serve, load and batch in one process, one after another, and write "
        "DIR/bench.json (every benchmark's object under its name, plus machine info) and PNG "
        "charts into DIR (about 25 minutes with the default model). With a BENCHMARK: run that one and print it.",
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        metavar="DIR",
        help="directory for bench.json and the charts (%(default)s)",
    )
    bench.add_argument(
        "--model",
        dest="all_model",
        default="smollm2",
        metavar="MODEL",
        help="model spec for every model benchmark, as for serve --model (%(default)s)",
    )
    bench.add_argument(
        "--json", dest="all_json", action="store_true", help="print the JSON object instead of the files written"
    )
    bench.set_defaults(run=run_all)
    benchmarks = bench.add_subparsers(dest="benchmark", required=False, metavar="BENCHMARK")
    for benchmark in BENCHMARKS:
        add_benchmark(benchmarks, benchmark)


def add_benchmark(sub: argparse._SubParsersAction, benchmark: Benchmark) -> argparse.ArgumentParser:
    parser = sub.add_parser(benchmark.name, help=benchmark.help, description=benchmark.description)
    for option in benchmark.options:
        parser.add_argument(option.flag, **option.argparse_kwargs())
    parser.set_defaults(run=run_one)
    return parser


def run_all(args: argparse.Namespace) -> int:
    """No BENCHMARK: the suite, bench.json and the charts written into --out."""
    with _json_stdout(args.all_json):
        from chat.tools.bench.suite import main

        return main(args.out, model=args.all_model, as_json=args.all_json)


def run_one(args: argparse.Namespace) -> int:
    """One benchmark: its module's ``main`` given each flag's value under the flag's keyword."""
    benchmark = BY_NAME[args.benchmark]
    keywords = {option.parameter: getattr(args, option.name) for option in benchmark.options}
    with _json_stdout(args.json or args.all_json):  # `bench --json NAME` too
        return importlib.import_module(benchmark.module).main(**keywords)


def _json_stdout(on: bool) -> contextlib.AbstractContextManager:
    """With --json: the JSON object alone on standard output, everything else on standard error."""
    if not on:
        return contextlib.nullcontext()
    from chat.tools.bench.report import json_stdout

    return json_stdout()
