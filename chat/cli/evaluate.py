"""`turncache eval`: run a JSONL dataset of conversations against a server (docs/eval.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    evaluate = sub.add_parser(
        "eval",
        help="run a JSONL dataset of conversations against a server",
        description="Send each conversation's user turns one by one, write per-turn results as JSONL and print a "
        "summary. Re-running with the same --out resumes. Format: docs/eval.md.",
    )
    evaluate.add_argument("dataset", type=Path, metavar="DATASET.jsonl", help="one conversation per line")
    evaluate.add_argument("--url", default="ws://127.0.0.1:8000/v1/ws", help="the server's WebSocket (%(default)s)")
    evaluate.add_argument("--concurrency", type=int, default=4, help="conversations in flight (%(default)s)")
    evaluate.add_argument(
        "--mode",
        choices=["stateful", "stateless"],
        default="stateful",
        help="a session per conversation, or completion.create with the whole history (%(default)s)",
    )
    evaluate.add_argument("--out", type=Path, help="results JSONL (default: ./<dataset>.<mode>.results.jsonl)")
    evaluate.add_argument("--token", default=os.environ.get("TURNCACHE_AUTH_TOKEN"), help="bearer token")
    evaluate.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each server event")
    evaluate.add_argument("--retry-errors", action="store_true", help="also redo finished conversations with errors")
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    evaluate.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    evaluate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chat.tools.evaluation import EvalOptions, main

    out = args.out or Path(f"{args.dataset.stem}.{args.mode}.results.jsonl")
    options = EvalOptions(
        dataset=args.dataset,
        url=args.url,
        out=out,
        mode=args.mode,
        concurrency=args.concurrency,
        token=args.token or None,
        timeout=args.timeout,
        retry_errors=args.retry_errors,
        progress=not args.no_progress,
    )
    return main(options, as_json=args.json)
