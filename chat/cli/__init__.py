"""The `turncache` command: serve, chat, eval, bench, one module each.

Each command's module adds its subparser (``add_parser``) and runs it (``run``); what more than one command uses
lives in ``common``. Nothing here imports ``chat.tools`` or a model until a command runs: the serving path stays
free of the tools (tests/chat/test_layout.py). Benchmarks print figures measured in the run that prints them;
nothing is made up or cached.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from chat.cli import bench, chat, evaluate, serve

COMMANDS = (serve, chat, evaluate, bench)  # in the order `turncache --help` lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turncache",
        description="A multimodal, multi-turn chat backend built around a sequence-level prefix cache.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


__all__ = ["build_parser", "main"]
