"""A profile of one chat turn (issue 37): where the time of a stateless HTTP chat turn goes, stage by stage.

``python -m chat.tools.bench.chat_profile --level 8`` runs ``bench chat``'s HTTP way once at ``level`` conversations
(server defaults, disk tier on; ``--no-disk``: off) with timers around the stages, and prints one JSON object:

- ``engine_ms_per_turn`` / ``engine_ms_per_token``: wall time the engine's worker thread spent in each stage, over
  the turns and over the completion tokens. The worker is the one thread every turn goes through; its time is what
  a turn costs every other turn. Stages: ``render`` (the chat template), ``tokenize`` (the rendered text's ids,
  reusing earlier renders'), ``lookup``, ``acquire``, ``restore`` (the run built from the lease: ``new_run``),
  ``miss_reason`` (these five: while admitting a turn; a step's second look at the cache counts to ``step_other``),
  ``admission_other`` (the rest of admitting a turn), ``prefill_forward`` / ``decode_forward`` (the
  batched forwards of steps with / without a prefill chunk), ``step_other`` (planning, sampling, detokenizing,
  storing entries: the rest of the steps), ``insert`` (the prefix cache's inserts, inside the steps), ``deliver``
  (handing events to the server's loop), ``idle`` (waiting for work);
- ``timeline_ms``: medians over the turns of the turn's path, each from the one before: ``parse_validate`` (the
  request's first byte at the ASGI app to the engine's ``submit``: body read, JSON parse, validation, building the
  turn), ``queue`` (submit to admission), ``admission`` (render, tokenize, lookup, restore), ``to_first_chunk``
  (admitted to its first prefill chunk handed out), ``prefill`` (first chunk to the prompt absorbed, steps of other
  turns included), ``first_token`` (prompt absorbed to first token sampled), ``first_write`` (first token sampled to
  its SSE event handed to the server), ``decode`` (first to last token), ``stream_end`` (last token to the
  response's last byte handed to the server); ``ttft_server`` (first byte to first content write);
- ``steps``: how many steps, how many held a prefill, mean tokens per step;
- ``server_cpu_s_per_turn``: the CPU time of the server's event-loop thread per turn (parsing, validation, SSE);
- ``wall_s``, ``turns``, ``tokens``.

The timers wrap methods of the classes involved for the duration of the run (a wrapper costs about a microsecond per
call); nothing of this is in the served code.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

ENGINE_THREAD = "turncache-engine"


class Timers:
    """Wall time per stage on the engine's worker thread, and each request's path."""

    def __init__(self) -> None:
        self.engine: dict[str, float] = defaultdict(float)
        self.requests: list[dict[str, float]] = []
        self.by_turn: dict[int, dict[str, float]] = {}
        self.steps = {"steps": 0, "with_prefill": 0, "tokens": 0}
        self.server_cpu_s = 0.0
        self.admitting = False  # the worker is admitting a turn (lookups in a step's look_again count to the step)


def _on_engine() -> bool:
    return threading.current_thread().name == ENGINE_THREAD


@contextlib.contextmanager
def _patched(obj, name: str, make) -> Iterator[None]:
    original = getattr(obj, name)
    setattr(obj, name, make(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


def _timed(timers: Timers, stage: str, admission_only: bool = False):
    def make(fn):
        def wrapper(*args, **kwargs):
            if not _on_engine() or (admission_only and not timers.admitting):
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timers.engine[stage] += time.perf_counter() - start

        return wrapper

    return make


_request: contextvars.ContextVar[dict | None] = contextvars.ContextVar("profiled_request", default=None)


def profiled_app(app, timers: Timers):
    """The ASGI app with each request's first byte, first content write and last write timed."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        record = {"start": time.perf_counter()}
        _request.set(record)

        async def timed_send(message):
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                if "first_write" not in record and b'"content":"' in body and b'"content":""' not in body:
                    record["first_write"] = time.perf_counter()
                if not message.get("more_body", False):
                    record["end"] = time.perf_counter()
            await send(message)

        await app(scope, receive, timed_send)
        timers.requests.append(record)

    return wrapped


@contextlib.contextmanager
def instrumented(engine, timers: Timers) -> Iterator[None]:
    """Timers around the stages of ``engine`` (its runtime's class, its cache, its scheduler) while in the block."""
    from chat.engine.engine import Engine
    from chat.engine.scheduler import Scheduler
    from chat.engine.turn import Turn
    from chat.models.prompt_tokens import PromptEncoder

    runtime_cls = type(engine.runtime)
    cache_cls = type(engine.cache)

    def submit(fn):
        def wrapper(self, request, sink):
            handle = fn(self, request, sink)
            record = _request.get()
            if record is not None:
                record["submit"] = time.perf_counter()
                timers.by_turn[id(handle.turn)] = record
                record["turn"] = handle.turn
            return handle

        return wrapper

    def admit(fn):
        def wrapper(self, job):
            record = timers.by_turn.get(id(job.turn))
            if record is not None:
                record["admit_start"] = time.perf_counter()
            start = time.perf_counter()
            timers.admitting = True
            try:
                return fn(self, job)
            finally:
                timers.admitting = False
                timers.engine["admission"] += time.perf_counter() - start
                if record is not None:
                    record["admit_end"] = time.perf_counter()

        return wrapper

    def step(fn):
        def wrapper(self):
            start = time.perf_counter()
            try:
                return fn(self)
            finally:
                timers.engine["step"] += time.perf_counter() - start
                last = self.last
                if last is not None and last.turns:
                    timers.steps["steps"] += 1
                    timers.steps["tokens"] += last.tokens
                    timers.steps["with_prefill"] += bool(last.prefills)

        return wrapper

    def forward(fn):
        def wrapper(self, feeds, *args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(self, feeds, *args, **kwargs)
            finally:
                prefill = any(f.logits != len(f.tokens) for f in feeds)  # a prompt chunk: not every row sampled
                key = "prefill_forward" if prefill else "decode_forward"
                timers.engine[key] += time.perf_counter() - start

        return wrapper

    def wait(fn):
        def wrapper(self):
            start = time.perf_counter()
            try:
                return fn(self)
            finally:
                timers.engine["admit_waiting"] += time.perf_counter() - start

        return wrapper

    patches = [
        (Engine, "submit", submit),
        (Engine, "_admit", admit),
        (Engine, "_deliver", _timed(timers, "deliver")),
        (Engine, "_admit_waiting", wait),
        (Scheduler, "step", step),
        (runtime_cls, "forward_batch", forward),
        (runtime_cls, "render_prompt", _timed(timers, "render_prompt", admission_only=True)),
        (runtime_cls, "new_run", _timed(timers, "restore", admission_only=True)),
        (PromptEncoder, "encode", _timed(timers, "tokenize")),
        (cache_cls, "lookup", _timed(timers, "lookup", admission_only=True)),
        (cache_cls, "acquire", _timed(timers, "acquire", admission_only=True)),
        (cache_cls, "insert", _timed(timers, "insert")),
        (cache_cls, "release", _timed(timers, "release")),
        (Turn, "_miss_reason", _timed(timers, "miss_reason", admission_only=True)),
    ]
    with contextlib.ExitStack() as stack:
        for obj, name, make in patches:
            stack.enter_context(_patched(obj, name, make))
        yield


def engine_stages(t: dict[str, float]) -> dict[str, float]:
    """The worker's time by stage, the nested timers taken apart (seconds)."""
    inside_admission = t["render_prompt"] + t["lookup"] + t["acquire"] + t["restore"] + t["miss_reason"]
    forwards = t["prefill_forward"] + t["decode_forward"]
    return {
        "render": t["render_prompt"] - t["tokenize"],
        "tokenize": t["tokenize"],
        "lookup": t["lookup"],
        "acquire": t["acquire"],
        "restore": t["restore"],
        "miss_reason": t["miss_reason"],
        "admission_other": t["admission"] - inside_admission,
        "prefill_forward": t["prefill_forward"],
        "decode_forward": t["decode_forward"],
        "insert": t["insert"],
        "release": t["release"],
        "step_other": t["step"] - forwards - t["insert"] - t["release"],
        "deliver": t["deliver"],
        "idle": t["admit_waiting"] - t["admission"],
    }


def timeline(records: list[dict]) -> dict[str, float]:
    """Medians over the requests of each stage of a turn's path (ms)."""
    stages: dict[str, list[float]] = defaultdict(list)
    for r in records:
        turn = r.get("turn")
        if turn is None or "end" not in r or "first_write" not in r or turn.clock.first_token is None:
            continue
        c = turn.clock
        points = [
            ("parse_validate", r["start"], r["submit"]),
            ("queue", r["submit"], r["admit_start"]),
            ("admission", r["admit_start"], r["admit_end"]),
            ("to_first_chunk", r["admit_end"], c.prefill_start),
            ("prefill", c.prefill_start, c.prefill_end),
            ("first_token", c.prefill_end, c.first_token),
            ("first_write", c.first_token, r["first_write"]),
            ("decode", c.first_token, c.last_token),
            ("stream_end", c.last_token, r["end"]),
            ("ttft_server", r["start"], r["first_write"]),
            ("total", r["start"], r["end"]),
        ]
        for name, a, b in points:
            stages[name].append((b - a) * 1e3)
    return {name: statistics.median(v) for name, v in stages.items()}


def profile(runtime, level: int, *, disk: bool = True, turns: int = 4, reply_tokens: int = 64) -> dict:
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings
    from chat.tools.bench.chat_bench import Engines, conversations, served_chats
    from chat.tools.bench.http_clients import ClientConfig, run_apart
    from chat.tools.bench.threads import leave_parallelism_to_engines

    leave_parallelism_to_engines()
    engines = Engines(runtime)
    warm = engines.make(disk)
    try:
        served_chats(warm, runtime, "http_chat", conversations(1, 2), reply_tokens)
    finally:
        engines.close(warm)
    engine = engines.make(disk)
    timers = Timers()
    try:
        app = create_app(engine, ServerSettings(), model_name=runtime.name)
        with BackgroundServer(_Asgi(profiled_app(app, timers), app)) as server, instrumented(engine, timers):
            loop_thread = server.thread
            cpu_start = _thread_cpu(loop_thread)
            convs = conversations(level, turns)
            replies, wall, _ = run_apart(ClientConfig("http_chat", server.url, convs, reply_tokens))
            server_cpu = _thread_cpu(loop_thread) - cpu_start
    finally:
        engines.close(engine)
    n_turns = len(timers.requests)
    tokens = sum(r.tokens for r in replies)
    stages = engine_stages(timers.engine)
    steps = timers.steps
    return {
        "level": level,
        "disk": disk,
        "wall_s": wall,
        "turns": n_turns,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "engine_ms_per_turn": {k: v * 1e3 / n_turns for k, v in stages.items()},
        "engine_ms_per_token": {k: v * 1e3 / tokens for k, v in stages.items()},
        "timeline_ms": timeline(timers.requests),
        "steps": {**steps, "tokens_per_step": steps["tokens"] / max(1, steps["steps"])},
        "server_cpu_s_per_turn": server_cpu / n_turns if server_cpu is not None else None,
        "errors": sum(1 for r in replies if r.error is not None),
    }


class _Asgi:
    """The profiled ASGI callable with the app's ``state`` (BackgroundServer reads its settings there)."""

    def __init__(self, wrapped, app) -> None:
        self._wrapped = wrapped
        self.state = app.state

    async def __call__(self, scope, receive, send):
        await self._wrapped(scope, receive, send)


def _thread_cpu(thread: threading.Thread) -> float | None:
    """CPU seconds of ``thread`` so far (Linux: /proc), None where unknown."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        import os

        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chat.tools.bench.chat_profile", description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--level", type=int, action="append", help="conversations (repeatable; default 8 and 32)")
    parser.add_argument("--no-disk", action="store_true", help="the cache without its disk tier")
    args = parser.parse_args(argv)
    from chat.models import load_model
    from chat.tools.bench.threads import in_fresh_thread

    runtime = in_fresh_thread(lambda: load_model(args.model))
    out = [profile(runtime, n, disk=not args.no_disk) for n in (args.level or [8, 32])]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
