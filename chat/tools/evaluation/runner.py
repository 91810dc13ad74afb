"""`turncache eval`: run a dataset of conversations against a chat server, turn by turn, and summarize.

Steps of :func:`run_eval`:

1. load the dataset (bad lines become one failed record each, they do not stop the run);
2. read the results file: conversations already finished there are skipped, partial ones are dropped (the file is
   rewritten atomically without them);
3. run the rest, ``concurrency`` at a time, each on its own WebSocket: ``stateful`` mode opens a session and sends
   the user messages one by one; ``stateless`` mode sends ``completion.create`` with the whole history each turn
   (the model's own earlier replies, not the references);
4. append each conversation's records at once when it is over (see :mod:`chat.tools.evaluation.results`);
5. summarize every record of this dataset in the file (:mod:`chat.tools.evaluation.summary`).

Nothing a single conversation does (a bad line, a missing file, a refused turn, a server that is down or drops the
connection) stops the run: it ends up as that conversation's ``error``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from chat.tools.client import (
    AsyncChatClient,
    ChatConnectionError,
    ChatError,
    ChatTimeout,
    ClientError,
    ConnectFailed,
    MediaEncodingError,
    Reply,
)
from chat.tools.evaluation.dataset import BadLine, EvalConversation, EvalTurn, load_dataset, missing_media, turn_content
from chat.tools.evaluation.results import Record, ResultsFile, read_results, turn_record
from chat.tools.evaluation.summary import Summary, format_summary, summarize

Mode = Literal["stateful", "stateless"]
MODES: tuple[Mode, ...] = ("stateful", "stateless")


class EvalUsageError(Exception):
    """The run cannot start: the arguments or files are unusable. Nothing was sent or written."""


@dataclass(frozen=True, slots=True)
class EvalOptions:
    dataset: Path  # the JSONL dataset
    url: str  # ws://HOST:PORT/v1/ws
    out: Path  # the results JSONL (appended to; resumed from)
    mode: Mode = "stateful"
    concurrency: int = 4  # conversations in flight
    token: str | None = None  # bearer token
    timeout: float | None = 300.0  # seconds to wait for each server event of a turn
    retry_errors: bool = False  # also redo finished conversations that have an error
    progress: bool = True  # tqdm bar on stderr


@dataclass(frozen=True, slots=True)
class EvalRun:
    summary: Summary  # over every record of this dataset in the results file
    ran: int  # conversations run by this call
    skipped: int  # conversations already finished in the results file
    dropped: int  # partial conversations removed from the results file
    wall_s: float  # time this call spent running conversations


def run_eval(options: EvalOptions) -> EvalRun:
    """Run the dataset; see the module docstring.

    Raises:
        EvalUsageError: the dataset is missing or unreadable, an option is out of range, or the results file
            cannot be used (unreadable, or holds results of the other mode).
        KeyboardInterrupt: the conversations finished so far are in the results file; run again to resume.
    """
    _check(options)
    try:
        entries = load_dataset(options.dataset)
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalUsageError(f"cannot read the dataset {options.dataset}: {exc}") from exc
    try:
        resumed = read_results(options.out)
    except OSError as exc:
        raise EvalUsageError(f"cannot read the results file {options.out}: {exc}") from exc

    expected = {e.id: max(1, len(e.turns)) for e in entries}
    by_id: dict[str, list[Record]] = {}
    for record in resumed.records:
        by_id.setdefault(record["id"], []).append(record)
    done = {cid for cid, recs in by_id.items() if cid in expected and _reusable(recs, expected[cid], options)}
    for cid in done:
        other = {r["mode"] for r in by_id[cid]} - {options.mode}
        if other:
            raise EvalUsageError(
                f"{options.out} holds {other.pop()} results for this dataset; "
                f"use another --out for a {options.mode} run"
            )
    keep = [r for r in resumed.records if r["id"] in done or r["id"] not in expected]
    todo = [e for e in entries if e.id not in done]

    try:
        rewrite = len(keep) != len(resumed.records) or resumed.dropped > 0 or resumed.unreadable > 0
        results = ResultsFile.open(options.out, keep, rewrite=rewrite)
    except OSError as exc:
        raise EvalUsageError(f"cannot write the results file {options.out}: {exc}") from exc
    if done or resumed.dropped or resumed.unreadable:
        dropped = f"; dropped {resumed.dropped} partial conversation(s)" if resumed.dropped else ""
        unreadable = f"; removed {resumed.unreadable} unreadable line(s)" if resumed.unreadable else ""
        print(
            f"turncache eval: resuming: {len(done)} of {len(entries)} conversations already in {options.out}"
            f"{dropped}{unreadable}",
            file=sys.stderr,
        )
    started = time.perf_counter()
    try:
        fresh = asyncio.run(_run_all(todo, options, results))
    finally:
        results.close()
    wall = time.perf_counter() - started
    records = [r for r in keep if r["id"] in expected] + fresh
    return EvalRun(summarize(records), len(todo), len(done), resumed.dropped, wall)


async def run_conversation(entry: EvalConversation | BadLine, options: EvalOptions, base: Path) -> list[Record]:
    """Run one conversation; never raises for anything the server or the data does. One record per user turn."""
    if isinstance(entry, BadLine):
        return [turn_record(entry.id, entry.line, 0, 1, options.mode, error=("invalid_dataset_line", entry.error))]
    records: list[Record] = []

    def fail_rest(code: str, message: str) -> None:
        for turn in entry.turns[len(records) :]:
            records.append(_record(entry, turn, options, error=(code, message)))

    missing = missing_media(entry, base)
    if missing:
        fail_rest("media_not_found", "missing media file(s): " + ", ".join(_shown(p, base) for p in missing))
        return records
    try:
        async with AsyncChatClient(options.url, token=options.token, timeout=options.timeout) as client:
            if options.mode == "stateful":
                await client.create_session(system=entry.system, sampling=entry.sampling)
            history: list[dict[str, Any]] = (
                [] if entry.system is None else [{"role": "system", "content": entry.system}]
            )
            for turn in entry.turns:
                records.append(await _run_turn(client, entry, turn, history, options, base))
    except ChatConnectionError as exc:
        fail_rest(_connection_code(exc), str(exc))
    except ChatError as exc:  # session.create refused
        fail_rest(exc.code, exc.message)
    except ClientError as exc:  # the server sent something that is not a server event
        fail_rest("unexpected_server_event", str(exc))
    return records


def main(options: EvalOptions, *, as_json: bool = False) -> int:
    """The command: run, print the summary table (or one JSON object) on stdout. Exit status: 0 when the run
    completed (per-conversation errors included), 2 for unusable arguments, 130 when interrupted."""
    try:
        run = run_eval(options)
    except EvalUsageError as exc:
        print(f"turncache eval: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\nturncache eval: interrupted; run the same command again to resume from {options.out}", file=sys.stderr
        )
        return 130
    info = {
        "dataset": str(options.dataset),
        "out": str(options.out),
        "mode": options.mode,
        "url": options.url,
        "ran": run.ran,
        "skipped": run.skipped,
        "wall_s": round(run.wall_s, 3),
    }
    if as_json:
        print(json.dumps({**info, **run.summary.as_dict()}))
    else:
        print(f"turncache eval: {options.dataset} ({options.mode}, {options.url}) -> {options.out}")
        print(f"ran {run.ran} conversations in {run.wall_s:.1f} s; {run.skipped} already done")
        print(format_summary(run.summary))
    return 0


# ---------------------------------------------------------------- internals


def _shown(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def _check(options: EvalOptions) -> None:
    if not options.dataset.is_file():
        raise EvalUsageError(f"the dataset {options.dataset} does not exist or is not a file")
    if not options.url.startswith(("ws://", "wss://")):
        raise EvalUsageError(
            f"--url must be a ws:// or wss:// URL, e.g. ws://127.0.0.1:8000/v1/ws, not {options.url!r}"
        )
    if options.mode not in MODES:
        raise EvalUsageError(f"--mode must be one of {', '.join(MODES)}")
    if options.concurrency < 1:
        raise EvalUsageError("--concurrency must be at least 1")
    if options.timeout is not None and options.timeout <= 0:
        raise EvalUsageError("--timeout must be positive")
    if options.out.resolve() == options.dataset.resolve():
        raise EvalUsageError("--out must not be the dataset itself")
    if options.out.exists() and not options.out.is_file():
        raise EvalUsageError(f"--out {options.out} is not a file")


def _reusable(records: list[Record], turns: int, options: EvalOptions) -> bool:
    """A finished conversation is kept when it has the dataset's number of turns (and no error, with --retry-errors)."""
    if records[0]["turns"] != turns:
        return False
    return not (options.retry_errors and any(r.get("error") for r in records))


async def _run_all(todo: list[EvalConversation | BadLine], options: EvalOptions, results: ResultsFile) -> list[Record]:
    base = options.dataset.resolve().parent
    out: list[Record] = []
    entries = iter(todo)
    bar = tqdm(total=len(todo), desc="eval", unit="conv", file=sys.stderr, disable=not options.progress)
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for entry in entries:  # one shared iterator: each conversation is taken by one worker
            try:
                records = await run_conversation(entry, options, base)
            except Exception as exc:  # a bug here must not cost the other conversations
                records = _failed(entry, options, ("eval_internal", f"{type(exc).__name__}: {exc}"))
            results.write_conversation(records)
            out.extend(records)
            failed += any(r["error"] for r in records)
            bar.set_postfix(errors=failed, refresh=False)
            bar.update(1)

    try:
        await asyncio.gather(*(worker() for _ in range(min(options.concurrency, len(todo)))))
    finally:
        bar.close()
    return out


async def _run_turn(
    client: AsyncChatClient,
    entry: EvalConversation,
    turn: EvalTurn,
    history: list[dict[str, Any]],
    options: EvalOptions,
    base: Path,
) -> Record:
    """One user turn. A refused or failed turn is recorded and left out of the history, as the server does."""
    try:
        content = turn_content(turn, base)
    except MediaEncodingError as exc:
        return _record(entry, turn, options, error=("media_encoding", str(exc)))
    user = {"role": "user", "content": content}
    try:
        if options.mode == "stateful":
            reply = await client.send(content)
        else:
            reply = await client.complete([*history, user], sampling=entry.sampling)
    except ChatError as exc:
        return _record(entry, turn, options, reply=exc.reply, error=(exc.code, exc.message))
    history += [user, {"role": "assistant", "content": reply.text}]
    return _record(entry, turn, options, reply=reply)


def _record(
    entry: EvalConversation,
    turn: EvalTurn,
    options: EvalOptions,
    *,
    reply: Reply | None = None,
    error: tuple[str, str] | None = None,
) -> Record:
    return turn_record(
        entry.id,
        entry.line,
        turn.index,
        len(entry.turns),
        options.mode,
        reply=reply,
        references=turn.references,
        error=error,
    )


def _failed(entry: EvalConversation | BadLine, options: EvalOptions, error: tuple[str, str]) -> list[Record]:
    if isinstance(entry, BadLine):
        return [turn_record(entry.id, entry.line, 0, 1, options.mode, error=error)]
    return [_record(entry, turn, options, error=error) for turn in entry.turns]


def _connection_code(exc: ChatConnectionError) -> str:
    if isinstance(exc, ConnectFailed):
        return "connect_failed"
    if isinstance(exc, ChatTimeout):
        return "timeout"
    return "connection_lost"
