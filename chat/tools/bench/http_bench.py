"""`turncache bench http`: what the server keeps of the engine's throughput, one run.

The workload is ``bench batch``'s (:mod:`chat.tools.bench.batch_bench`): at each level of concurrent sessions, every
session asks one different question at the same moment, greedy, replies of ``reply_tokens`` (64) tokens. Each level
runs three ways in this one process, each on a fresh engine with an empty prefix cache (the same prompts would hit
otherwise):

- ``engine``: the turns submitted to the engine directly (``bench batch``'s measurement);
- ``http``: ``POST /v1/chat/completions`` with ``stream: true`` to a real server on loopback (uvicorn in a thread of
  this process), from an asyncio client (httpx) that reads the server-sent events line by line and parses each;
- ``ws``: ``completion.create`` on one WebSocket per session (the ``websockets`` client), every event parsed.

A level's rate is all completion tokens (the replies' ``usage``) over its wall time, from the first request sent to
the last reply ended; its time to first token is the median over sessions (served: from the request sent to the
first content received, on the client's clock; engine: the engine's own ``ttft_ms``). Each level runs ``rounds``
times (3), the three ways one after another within a round, and reports medians.

Keys: ``levels``; per level, as lists in the order of ``levels``: ``engine_tokens_per_s``, ``http_tokens_per_s``,
``ws_tokens_per_s``, ``http_ttft_p50_ms``, ``engine_ttft_p50_ms``, ``served_ratio_http`` and ``served_ratio_ws``
(served rate / engine rate); ``client_cpu_share``: the CPU time of the client (the thread that runs the clients'
event loop, read with ``time.thread_time`` around each served run) over the served runs' wall time x the machine's
cores, so 0.5 on 2 cores means the client took one core to itself; ``errors``: turns that failed, on any path.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass

from chat.tools.bench.batch_bench import prompts, run_level
from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

LEVELS = (1, 8, 32)
TIMEOUT_S = 600.0  # the longest a client waits for the next bytes of a reply


@dataclass
class Served:
    """One session's reply as a client saw it."""

    tokens: int  # completion tokens, from the reply's usage
    ttft_ms: float | None  # request sent -> first content received (None: no content)
    error: str | None = None


@dataclass
class Level:
    """One run of one level one way."""

    tokens_per_s: float
    ttft_p50_ms: float
    errors: int
    wall_s: float
    client_cpu_s: float = 0.0  # served runs: the client thread's CPU time over wall_s


def _chat_body(messages: list[dict], reply_tokens: int, stream: bool = True) -> dict:
    return {"messages": messages, "temperature": 0.0, "max_tokens": reply_tokens, "stream": stream}


async def http_session(client, url: str, messages: list[dict], reply_tokens: int) -> Served:
    """One streamed chat completion over ``client`` (an ``httpx.AsyncClient``): every ``data:`` line parsed."""
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", url, json=_chat_body(messages, reply_tokens)) as response:
        if response.status_code != 200:
            return Served(0, None, f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return Served(tokens, ttft, str(chunk["error"]))
            if ttft is None and any(c["delta"].get("content") for c in chunk["choices"]):
                ttft = (time.perf_counter() - start) * 1000
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return Served(tokens, ttft)


async def ws_session(url: str, messages: list[dict], reply_tokens: int) -> Served:
    """One ``completion.create`` on a WebSocket of its own: every event parsed."""
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None) as ws:
        start = time.perf_counter()
        sampling = {"temperature": 0.0, "max_tokens": reply_tokens}
        await ws.send(json.dumps({"type": "completion.create", "messages": messages, "sampling": sampling}))
        ttft = None
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            if event["type"] == "reply.delta" and ttft is None:
                ttft = (time.perf_counter() - start) * 1000
            elif event["type"] == "error" and "turn_id" not in event:
                return Served(0, ttft, f"{event['code']}: {event['message']}")
            elif event["type"] == "reply.done":
                error = None if event["finish_reason"] in ("stop", "length") else event["finish_reason"]
                return Served(event["usage"]["completion_tokens"], ttft, error)


async def _http_level(base: str, conversations: list[list[dict]], reply_tokens: int) -> list[Served | BaseException]:
    import httpx

    limits = httpx.Limits(max_connections=len(conversations), max_keepalive_connections=len(conversations))
    async with httpx.AsyncClient(limits=limits, timeout=TIMEOUT_S) as client:
        url = base + "/v1/chat/completions"
        return await asyncio.gather(
            *(http_session(client, url, m, reply_tokens) for m in conversations), return_exceptions=True
        )


async def _ws_level(base: str, conversations: list[list[dict]], reply_tokens: int) -> list[Served | BaseException]:
    url = base.replace("http://", "ws://") + "/v1/ws"
    return await asyncio.gather(*(ws_session(url, m, reply_tokens) for m in conversations), return_exceptions=True)


def served_level(engine, runtime, client, conversations: list[list[dict]], reply_tokens: int) -> Level:
    """All conversations at once through a server over ``engine``, from ``client`` (:func:`_http_level` or
    :func:`_ws_level`), whose event loop runs in this thread."""
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
        cpu, start = time.thread_time(), time.perf_counter()
        replies = asyncio.run(client(server.url, conversations, reply_tokens))
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    ok = [r for r in replies if isinstance(r, Served) and r.error is None]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    return Level(
        sum(r.tokens for r in ok) / wall,
        statistics.median(ttfts) if ttfts else float("nan"),
        len(replies) - len(ok),
        wall,
        cpu,
    )


def engine_level(engine, conversations: list[list[dict]], reply_tokens: int) -> Level:
    wall, ttfts, tokens, failed = run_level(engine, conversations, reply_tokens)
    return Level(tokens / wall, statistics.median(ttfts) if ttfts else float("nan"), failed, wall)


def run_on(
    runtime,
    *,
    levels: tuple[int, ...] = LEVELS,
    reply_tokens: int = 64,
    rounds: int = 3,
    max_batch: int | None = None,
    token_budget: int | None = None,
) -> dict:
    """The benchmark on a loaded runtime. Torch runs in parallel only in the engines' workers: this thread (the
    clients' event loop) stays single-threaded (chat.tools.bench.threads)."""
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.scheduler import BatchSettings

    leave_parallelism_to_engines()
    settings = BatchSettings(**{k: v for k, v in (("max_batch", max_batch), ("token_budget", token_budget)) if v})
    ways = {
        "engine": lambda e, c: engine_level(e, c, reply_tokens),
        "http": lambda e, c: served_level(e, runtime, _http_level, c, reply_tokens),
        "ws": lambda e, c: served_level(e, runtime, _ws_level, c, reply_tokens),
    }
    warm = Engine(runtime, cache=PrefixCache(), batch=settings, threads=engine_threads())
    try:  # every weight touched once, the server's code paths imported
        ways["engine"](warm, prompts(1))
        ways["http"](warm, prompts(1))
    finally:
        warm.close()
    results: dict[str, list[list[Level]]] = {way: [] for way in ways}
    for n in levels:
        runs: dict[str, list[Level]] = {way: [] for way in ways}
        for _ in range(rounds):
            for way, measure in ways.items():
                engine = Engine(runtime, cache=PrefixCache(), batch=settings, threads=engine_threads())
                try:
                    runs[way].append(measure(engine, prompts(n)))
                finally:
                    engine.close()
        for way in ways:
            results[way].append(runs[way])
    return summary(levels, results)


def summary(levels: tuple[int, ...], results: dict[str, list[list[Level]]]) -> dict:
    """The result object from every run: ``results[way][level index]`` lists that level's rounds."""

    def median(way: str, field: str) -> list[float]:
        return [statistics.median(getattr(r, field) for r in runs) for runs in results[way]]

    engine, http, ws = (median(w, "tokens_per_s") for w in ("engine", "http", "ws"))
    served = [r for way in ("http", "ws") for runs in results[way] for r in runs]
    served_wall = sum(r.wall_s for r in served)
    return {
        "levels": list(levels),
        "engine_tokens_per_s": engine,
        "http_tokens_per_s": http,
        "ws_tokens_per_s": ws,
        "http_ttft_p50_ms": median("http", "ttft_p50_ms"),
        "engine_ttft_p50_ms": median("engine", "ttft_p50_ms"),
        "served_ratio_http": [h / e for h, e in zip(http, engine, strict=True)],
        "served_ratio_ws": [w / e for w, e in zip(ws, engine, strict=True)],
        "client_cpu_share": sum(r.client_cpu_s for r in served) / (served_wall * (os.cpu_count() or 1)),
        "errors": sum(r.errors for runs in results.values() for level in runs for r in level),
    }


TARGETS = {"errors": ("==", 0)}


def targets_met(result: dict) -> dict[str, bool]:
    """The issue's targets: served / engine >= 0.85 at 8 and 32 sessions, both transports, and no errors."""
    out = {"errors == 0": result["errors"] == 0}
    for way in ("http", "ws"):
        for level, ratio in zip(result["levels"], result[f"served_ratio_{way}"], strict=True):
            if level >= 8:
                out[f"served_ratio_{way} at {level} >= 0.85"] = ratio >= 0.85
    return out


def main(as_json: bool, model: str = "smollm2", levels: tuple[int, ...] = LEVELS) -> int:
    from chat.models import load_model

    result = run_on(in_fresh_thread(lambda: load_model(model)), levels=levels)
    if not as_json:
        result = {**result, **{f"target: {k}": v for k, v in targets_met(result).items()}}
    emit(result, TARGETS, as_json)
    return 0
