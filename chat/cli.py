"""The `turncache` command: serve, chat, eval, bench.

A subcommand that is not built yet says so on stderr and exits with status 2; it never prints made-up output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

NOT_BUILT = 2


def _not_built(what: str) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        print(f"turncache: {what} is not built yet.", file=sys.stderr)
        return NOT_BUILT

    return run


def _bench_cache(args: argparse.Namespace) -> int:
    from chat.bench.cache_bench import main

    return main(as_json=args.json, entries=args.entries)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turncache",
        description="A multimodal, multi-turn chat backend built around a sequence-level prefix cache.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the chat server (WebSocket + OpenAI-compatible HTTP) [not built yet]")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_not_built("the server (`turncache serve`)"))

    chat = sub.add_parser("chat", help="chat in the terminal on the engine, without a server [not built yet]")
    chat.set_defaults(run=_not_built("the terminal chat (`turncache chat`)"))

    evaluate = sub.add_parser("eval", help="run a JSONL dataset of conversations against a server [not built yet]")
    evaluate.set_defaults(run=_not_built("the eval runner (`turncache eval`)"))

    bench = sub.add_parser("bench", help="benchmarks that print measured figures")
    bench_sub = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    cache = bench_sub.add_parser("cache", help="the prefix cache alone: lookup latency, restore time, memory")
    cache.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    cache.add_argument("--entries", type=int, default=None, help="entries in the lookup benchmark (10,000)")
    cache.set_defaults(run=_bench_cache)
    for name, what in (("turns", "multi-turn chat on a model"), ("serve", "concurrent sessions on a server")):
        other = bench_sub.add_parser(name, help=f"{what} [not built yet]")
        other.add_argument("--json", action="store_true")
        other.set_defaults(run=_not_built(f"`turncache bench {name}`"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
