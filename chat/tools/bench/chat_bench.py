"""`turncache bench chat`: what a served multi-turn chat keeps of the engine, with the server's default settings.

The workload (issue 37): ``N`` conversations at once (levels 1, 8, 32), each a system message and ``turns`` (4) user
messages of about 40 words, greedy replies of at most ``reply_tokens`` (64) tokens; a conversation sends its next
message as soon as its reply has ended, the reply appended to its history. Each level runs these ways, each on a
fresh engine with the server's default settings (prefix cache budgets, scheduler; the disk tier on, in a fresh
temporary directory) and an empty cache:

- ``engine``: the turns fed to the engine directly (:meth:`Engine.submit` with the whole history, which the engine
  renders and tokenizes as it does for the server), no server;
- ``http``: stateless ``POST /v1/chat/completions`` with ``stream: true`` and the whole history, through a server on
  loopback, from the light asyncio client of ``bench http`` (aiohttp on uvloop, in a process of its own:
  :mod:`chat.tools.bench.http_clients`);
- ``ws``: one WebSocket session per conversation (``session.create``, then ``turn.create`` per message): the server
  keeps the history;
- ``http_no_disk``: ``http`` on an engine whose cache has no disk tier (``--disk-budget 0``), for
  ``disk_tier_cost``;
- ``decode_only``: ``bench batch``'s measurement at the same level (``N`` single questions, replies of
  ``reply_tokens``, no disk tier), for ``engine_chat_efficiency``.

A run's rate is all completion tokens over its wall time (first request sent to last reply ended); its first-token
time is the median over every turn of every conversation (served: request sent to first content, client's clock;
engine: the engine's own ``ttft_ms``, from the submit). Each level runs ``rounds`` times, the ways back to back in
each round, their order reversed every other round (``bench http``'s scheme); rates and first-token times are medians
over the rounds, ratios the median over the rounds of each round's own ratio. A run's disk writes are flushed after
its wall time ends, outside the measurement (a deployment writes them while its engine has nothing to do).

Keys (lists in the order of ``levels``): ``levels``; ``engine_tokens_per_s``, ``http_tokens_per_s``,
``ws_tokens_per_s``, ``decode_only_tokens_per_s``; ``chat_ratio_http`` / ``chat_ratio_ws`` (served / engine);
``engine_chat_efficiency`` (engine / decode-only); ``ttft_p50_ms``: {way: list}; ``cached_ratio``: cached / prompt
tokens of the turns after each conversation's first (HTTP); ``disk_tier_cost``: 1 - (HTTP with the disk tier) /
(HTTP without it); ``disk_tier_ttft_ratio``: first-token p50 with the disk tier / without (HTTP);
``client_cpu_share``: the clients' process's CPU time over the served runs' wall time x the machine's cores;
``tokens_per_s_by_round``: {way: per level, each round's rate in the order the rounds ran} (an outlier a median hides
shows here); ``rounds``; ``errors``: turns that failed, on any way.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from chat.tools.bench.batch_bench import prompts, run_level
from chat.tools.bench.http_bench import round_order
from chat.tools.bench.http_clients import ClientConfig, Served, run_apart
from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

LEVELS = (1, 8, 32)
TURNS = 4
REPLY_TOKENS = 64
DEFAULT_ROUNDS = 2
WAYS = ("engine", "http", "ws", "http_no_disk", "decode_only")
SYSTEM = "You are a helpful assistant. Answer clearly and stay on the subject of the conversation."
SUBJECTS = (
    "planting a small vegetable garden on a balcony",
    "learning to play the guitar as an adult",
    "planning a cheap weekend trip by train",
    "keeping a sourdough starter alive",
    "training a young dog to walk on a lead",
    "choosing a first telescope for watching planets",
    "repairing a bicycle tyre at the roadside",
    "writing a short mystery story for children",
)
FOLLOW_UPS = (
    "I would like some practical advice about {subject}. I have very little time during the week, a small budget, "
    "and no experience at all, so please tell me where I should start and which mistakes beginners usually make.",
    "Thank you, that helps. Could you now explain the second step in more detail, with an example from everyday "
    "life, and say how long it usually takes before I can see whether it is working or not?",
    "That sounds reasonable, but I am worried about one thing: what should I do if it goes wrong the first time? "
    "Please describe the most common problems, how to notice them early, and how to fix each of them.",
    "Finally, could you put everything together as a short plan for the next four weeks, one line per week, so "
    "that I can print it and keep it on the fridge as a reminder of what to do next?",
)


def conversations(n: int, turns: int = TURNS) -> list[list[dict]]:
    """``n`` different conversations: the system message, then ``turns`` user messages of about 40 words."""
    out = []
    for i in range(n):
        subject = SUBJECTS[i % len(SUBJECTS)]
        users = [
            {"role": "user", "content": f"(Chat {i + 1}.) " + FOLLOW_UPS[t % len(FOLLOW_UPS)].format(subject=subject)}
            for t in range(turns)
        ]
        out.append([{"role": "system", "content": SYSTEM}, *users])
    return out


@dataclass
class ChatRun:
    """One run of one level one way."""

    tokens_per_s: float
    ttft_p50_ms: float
    errors: int
    wall_s: float
    later_prompt_tokens: int = 0  # prompt tokens of the turns after each conversation's first
    later_cached_tokens: int = 0  # of those, served from the cache
    client_cpu_s: float = 0.0


def engine_chats(engine, convs: list[list[dict]], reply_tokens: int) -> ChatRun:
    """Every conversation at once on ``engine``, each turn submitted when the one before it ended (from the
    engine's worker, as its last event arrives: no thread hop on the way)."""
    from chat.engine.events import Done, TurnRequest
    from chat.engine.sampling import SamplingParams

    lock = threading.Lock()
    finished = threading.Event()
    left = [len(convs)]
    ttfts: list[float] = []
    totals = {"tokens": 0, "errors": 0, "prompt": 0, "cached": 0}
    params = SamplingParams(max_tokens=reply_tokens)

    def run(conv: list[dict]) -> None:
        history = conv[:1]
        users = iter(conv[1:])

        def end() -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    finished.set()

        def next_turn(first: bool) -> None:
            user = next(users, None)
            if user is None:
                end()
                return
            history.append(user)
            engine.submit(TurnRequest(list(history), params), lambda e: sink(e, first))

        def sink(event, first: bool) -> None:
            if isinstance(event, BaseException) or (
                isinstance(event, Done) and event.finish_reason not in ("stop", "length")
            ):
                with lock:
                    totals["errors"] += 1
                end()
                return
            if not isinstance(event, Done):
                return
            with lock:
                totals["tokens"] += event.usage.completion_tokens
                ttfts.append(event.timings.ttft_ms)
                if not first:
                    totals["prompt"] += event.usage.prompt_tokens
                    totals["cached"] += event.usage.cached_tokens
            history.append({"role": "assistant", "content": event.text})
            next_turn(False)

        next_turn(True)

    start = time.perf_counter()
    for conv in convs:
        run(conv)
    finished.wait()
    wall = time.perf_counter() - start
    return ChatRun(
        totals["tokens"] / wall,
        statistics.median(ttfts) if ttfts else float("nan"),
        totals["errors"],
        wall,
        totals["prompt"],
        totals["cached"],
    )


def served_chats(engine, runtime, transport: str, convs: list[list[dict]], reply_tokens: int) -> ChatRun:
    """Every conversation at once through a server over ``engine`` (default settings) on loopback, from the clients'
    process (``transport``: "http_chat" or "ws_chat")."""
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    app = create_app(engine, ServerSettings(), model_name=runtime.name)
    with BackgroundServer(app) as server:
        replies, wall, cpu = run_apart(ClientConfig(transport, server.url, convs, reply_tokens))
    ok = [r for r in replies if isinstance(r, Served)]
    ttfts = [t for r in ok for t in r.turn_ttfts_ms]
    failed = [r for r in ok if r.error is not None]
    return ChatRun(
        sum(r.tokens for r in ok) / wall,
        statistics.median(ttfts) if ttfts else float("nan"),
        len(failed) + len(replies) - len(ok),
        wall,
        sum(r.later_prompt_tokens for r in ok),
        sum(r.later_cached_tokens for r in ok),
        cpu,
    )


def decode_only(engine, n: int, reply_tokens: int) -> ChatRun:
    wall, ttfts, tokens, failed = run_level(engine, prompts(n), reply_tokens)
    return ChatRun(tokens / wall, statistics.median(ttfts) if ttfts else float("nan"), failed, wall)


class Engines:
    """Fresh engines with the server's default settings, the disk tier in a fresh temporary directory (or off)."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self._dirs: dict[int, str] = {}  # id(engine) -> its cache directory

    def make(self, disk: bool):
        from chat.engine.engine import Engine
        from chat.server.main import batch_settings, build_cache
        from chat.server.settings import ServerSettings

        cache_dir = tempfile.mkdtemp(prefix="turncache-bench-chat-") if disk else None
        settings = ServerSettings(cache_dir=cache_dir, disk_budget=ServerSettings().disk_budget if disk else 0)
        engine = Engine(
            self.runtime, cache=build_cache(settings), batch=batch_settings(settings), threads=engine_threads()
        )
        if cache_dir is not None:
            self._dirs[id(engine)] = cache_dir
        return engine

    def close(self, engine) -> None:
        """Stop the engine, write its cache's queued files (outside any measurement), remove its directory."""
        from chat.server.main import close_engine

        close_engine(engine)
        cache_dir = self._dirs.pop(id(engine), None)
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)


def run_on(
    runtime,
    *,
    levels: tuple[int, ...] = LEVELS,
    turns: int = TURNS,
    reply_tokens: int = REPLY_TOKENS,
    rounds: int = DEFAULT_ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The benchmark on a loaded runtime; its result object."""
    leave_parallelism_to_engines()
    engines = Engines(runtime)
    ways: dict[str, tuple[bool, Callable]] = {  # way -> (disk tier on, run(engine, n))
        "engine": (True, lambda e, n: engine_chats(e, conversations(n, turns), reply_tokens)),
        "http": (True, lambda e, n: served_chats(e, runtime, "http_chat", conversations(n, turns), reply_tokens)),
        "ws": (True, lambda e, n: served_chats(e, runtime, "ws_chat", conversations(n, turns), reply_tokens)),
        "http_no_disk": (
            False,
            lambda e, n: served_chats(e, runtime, "http_chat", conversations(n, turns), reply_tokens),
        ),
        "decode_only": (False, lambda e, n: decode_only(e, n, reply_tokens)),
    }
    for way in ("engine", "http"):  # warm-up: every weight touched once, the server's code paths imported
        warm = engines.make(True)
        try:
            ways[way][1](warm, 1)
        finally:
            engines.close(warm)
    results: dict[str, list[list[ChatRun]]] = {way: [] for way in ways}
    for n in levels:
        runs: dict[str, list[ChatRun]] = {way: [] for way in ways}
        for r in range(rounds):
            for way in round_order(tuple(ways), r):
                disk, fn = ways[way]
                engine = engines.make(disk)
                try:
                    runs[way].append(fn(engine, n))
                finally:
                    engines.close(engine)
                if progress is not None:
                    progress(f"chat: {n} conversations, round {r + 1}, {way}: {runs[way][-1].tokens_per_s:.1f} tok/s")
        for way in ways:
            results[way].append(runs[way])
    return {**summary(levels, results), "rounds": rounds}


def summary(levels: tuple[int, ...], results: dict[str, list[list[ChatRun]]]) -> dict:
    """The result object: ``results[way][level index]`` lists that level's rounds in the order they ran."""

    def median(way: str, name: str = "tokens_per_s") -> list[float]:
        return [statistics.median(getattr(r, name) for r in runs) for runs in results[way]]

    def paired(top: str, bottom: str, fn: Callable[[float, float], float] = lambda a, b: a / b) -> list[float]:
        return [
            statistics.median(fn(a.tokens_per_s, b.tokens_per_s) for a, b in zip(tops, bottoms, strict=True))
            for tops, bottoms in zip(results[top], results[bottom], strict=True)
        ]

    def paired_ttft(top: str, bottom: str) -> list[float]:
        return [
            statistics.median(a.ttft_p50_ms / b.ttft_p50_ms for a, b in zip(tops, bottoms, strict=True))
            for tops, bottoms in zip(results[top], results[bottom], strict=True)
        ]

    served = [r for way in ("http", "ws", "http_no_disk") for runs in results[way] for r in runs]
    served_wall = sum(r.wall_s for r in served)
    cached = []
    for runs in results["http"]:
        prompt = sum(r.later_prompt_tokens for r in runs)
        cached.append(sum(r.later_cached_tokens for r in runs) / prompt if prompt else 0.0)
    return {
        "levels": list(levels),
        "engine_tokens_per_s": median("engine"),
        "http_tokens_per_s": median("http"),
        "ws_tokens_per_s": median("ws"),
        "http_no_disk_tokens_per_s": median("http_no_disk"),
        "decode_only_tokens_per_s": median("decode_only"),
        "chat_ratio_http": paired("http", "engine"),
        "chat_ratio_ws": paired("ws", "engine"),
        "engine_chat_efficiency": paired("engine", "decode_only"),
        "ttft_p50_ms": {way: median(way, "ttft_p50_ms") for way in results},
        "tokens_per_s_by_round": {way: [[r.tokens_per_s for r in runs] for runs in results[way]] for way in results},
        "cached_ratio": cached,
        "disk_tier_cost": paired("http", "http_no_disk", lambda a, b: 1 - a / b),
        "disk_tier_ttft_ratio": paired_ttft("http", "http_no_disk"),
        "client_cpu_share": sum(r.client_cpu_s for r in served) / (served_wall * (os.cpu_count() or 1)),
        "errors": sum(r.errors for runs in results.values() for level in runs for r in level),
    }


TARGETS = {"errors": ("==", 0)}


def targets_met(result: dict) -> dict[str, bool]:
    """Issue 37's targets: at 8 and 32 conversations, served / engine >= 0.85 both ways, engine chat / decode-only
    >= 0.8, first token p50 <= 0.3 s at 8 and 0.6 s at 32 (served ways); everywhere the disk tier costs <= 5% of
    throughput; no errors."""
    out = {"errors == 0": result["errors"] == 0}
    bound = {8: 300.0, 32: 600.0}
    for i, level in enumerate(result["levels"]):
        out[f"disk_tier_cost at {level} <= 0.05"] = result["disk_tier_cost"][i] <= 0.05
        if level not in bound:
            continue
        for way in ("http", "ws"):
            out[f"chat_ratio_{way} at {level} >= 0.85"] = result[f"chat_ratio_{way}"][i] >= 0.85
            out[f"ttft_p50_ms {way} at {level} <= {bound[level]:.0f}"] = result["ttft_p50_ms"][way][i] <= bound[level]
        out[f"engine_chat_efficiency at {level} >= 0.8"] = result["engine_chat_efficiency"][i] >= 0.8
    return out


def main(
    as_json: bool,
    model: str = "smollm2",
    levels: tuple[int, ...] = LEVELS,
    *,
    rounds: int = DEFAULT_ROUNDS,
    turns: int = TURNS,
) -> int:
    import sys

    from chat.models import load_model

    runtime = in_fresh_thread(lambda: load_model(model))
    result = run_on(
        runtime, levels=levels, rounds=rounds, turns=turns, progress=lambda m: print(m, file=sys.stderr, flush=True)
    )
    if not as_json:
        result = {**result, **{f"target: {k}": v for k, v in targets_met(result).items()}}
    emit(result, TARGETS, as_json)
    return 0
