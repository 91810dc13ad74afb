"""`turncache bench serve`: concurrent WebSocket sessions against a real server on loopback, one run.

Workload: ``sessions`` concurrent sessions x ``turns`` turns on one model; one session asks for long replies, the
others for short ones. Then, side by side: short turns on an otherwise idle server, and the same short turns while
one long reply streams.

Keys: ``sessions``, ``turns``, ``errors``, ``ttft_p50_ms``, ``ttft_p99_ms`` (all turns of the workload),
``cached_ratio`` (cached / prompt tokens over turns 2+), ``ttft_idle_p50_ms``, ``ttft_contended_p50_ms`` and
``ttft_contended_ratio`` (contended / idle), ``wall_s``, ``ttft_ms_samples`` (every turn's time to first token,
sorted: the distribution behind the percentiles).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

from websockets.asyncio.client import connect

from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

QUESTIONS = [
    "What is a good name for a cat?",
    "Name a color of the sky.",
    "What is two plus two?",
    "Say hello in French.",
    "Name a fruit that is yellow.",
    "What day comes after Monday?",
    "Name an animal that swims.",
    "What is the opposite of hot?",
]
LONG_PROMPT = "Write a long, detailed story about a lighthouse keeper and the sea. Make it at least ten paragraphs."


@dataclass
class TurnResult:
    ttft_ms: float | None
    prompt_tokens: int
    cached_tokens: int
    turn: int
    error: str | None = None


async def _session(
    url: str, turns: int, *, long: bool, short_tokens: int, long_tokens: int, offset: int
) -> list[TurnResult]:
    out: list[TurnResult] = []
    async with connect(url, max_size=None) as ws:
        sampling = {"temperature": 0.0, "max_tokens": long_tokens if long else short_tokens}
        await ws.send(
            json.dumps({"type": "session.create", "system": "You are a helpful assistant.", "sampling": sampling})
        )
        await _until(ws, "session.created")
        for turn in range(turns):
            text = LONG_PROMPT if long else QUESTIONS[(offset + turn) % len(QUESTIONS)]
            out.append(await _turn(ws, {"type": "turn.create", "content": text}, turn))
    return out


async def _until(ws, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 600))
        if event["type"] == kind:
            return event
        if event["type"] == "error" and kind != "error" and "turn_id" not in event:
            raise RuntimeError(f"{event['code']}: {event['message']}")


async def _turn(ws, event: dict, turn: int) -> TurnResult:
    await ws.send(json.dumps(event))
    error = None
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 600))
        if msg["type"] == "error":
            error = f"{msg['code']}: {msg['message']}"
            if "turn_id" not in msg:
                return TurnResult(None, 0, 0, turn, error)
        if msg["type"] == "reply.done":
            usage = msg["usage"]
            if msg["finish_reason"] == "error" and error is None:
                error = "error"
            return TurnResult(
                msg["timings"].get("ttft_ms"),
                usage["prompt_tokens"],
                usage["prompt_tokens_details"]["cached_tokens"],
                turn,
                error,
            )


async def _short_turns(url: str, n: int, short_tokens: int) -> list[float]:
    """``n`` short stateless turns, one after another; their times to first token."""
    ttfts = []
    async with connect(url, max_size=None) as ws:
        for i in range(n):
            messages = [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" (variant {i})"},
            ]
            r = await _turn(
                ws,
                {
                    "type": "completion.create",
                    "messages": messages,
                    "sampling": {"temperature": 0.0, "max_tokens": short_tokens},
                },
                i,
            )
            if r.ttft_ms is not None:
                ttfts.append(r.ttft_ms)
    return ttfts


async def _contended(url: str, n: int, short_tokens: int, long_tokens: int) -> list[float]:
    async with connect(url, max_size=None) as ws:
        messages = [{"role": "user", "content": LONG_PROMPT}]
        await ws.send(
            json.dumps(
                {
                    "type": "completion.create",
                    "messages": messages,
                    "sampling": {"temperature": 0.0, "max_tokens": long_tokens},
                }
            )
        )
        await _until(ws, "reply.delta")  # the long reply is streaming now
        ttfts = await _short_turns(url, n, short_tokens)
        await ws.send(json.dumps({"type": "turn.cancel"}))
        await _until(ws, "reply.done")
    return ttfts


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _run(url: str, sessions: int, turns: int, short_tokens: int, long_tokens: int, probes: int) -> dict:
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(
            _session(url, turns, long=(i == 0), short_tokens=short_tokens, long_tokens=long_tokens, offset=i)
            for i in range(sessions)
        )
    )
    wall = time.perf_counter() - t0
    flat = [r for rs in results for r in rs]
    ttfts = [r.ttft_ms for r in flat if r.ttft_ms is not None]
    later = [r for r in flat if r.turn > 0 and r.error is None]
    idle = await _short_turns(url, probes, short_tokens)
    contended = await _contended(url, probes, short_tokens, long_tokens)
    idle_p50, contended_p50 = statistics.median(idle), statistics.median(contended)
    return {
        "sessions": sessions,
        "turns": len(flat),
        "errors": sum(1 for r in flat if r.error is not None),
        "ttft_p50_ms": _pct(ttfts, 0.5),
        "ttft_p99_ms": _pct(ttfts, 0.99),
        "cached_ratio": sum(r.cached_tokens for r in later) / max(1, sum(r.prompt_tokens for r in later)),
        "ttft_idle_p50_ms": idle_p50,
        "ttft_contended_p50_ms": contended_p50,
        "ttft_contended_ratio": contended_p50 / idle_p50,
        "wall_s": wall,
        "ttft_ms_samples": sorted(ttfts),
    }


def run(model: str = "smollm2", chat_template: str | None = None, **kwargs) -> dict:
    from chat.models import load_model

    return run_on(in_fresh_thread(lambda: load_model(model, chat_template=chat_template)), **kwargs)


def run_on(
    runtime, *, sessions: int = 8, turns: int = 5, short_tokens: int = 24, long_tokens: int = 400, probes: int = 5
) -> dict:
    """The benchmark on an already loaded runtime."""
    leave_parallelism_to_engines()  # torch runs in parallel in the engine's worker only (chat.tools.bench.threads)
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    engine = Engine(
        runtime,
        cache=PrefixCache(device_budget_bytes=1024 * 1024 * 1024, host_budget_bytes=0),
        threads=engine_threads(),
    )
    try:
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
            url = server.url.replace("http://", "ws://") + "/v1/ws"
            result = asyncio.run(_run(url, sessions, turns, short_tokens, long_tokens, probes))
    finally:
        engine.close()
    return {"model": runtime.name, **result}


TARGETS = {"errors": ("==", 0), "cached_ratio": (">=", 0.8), "ttft_contended_ratio": ("<=", 3.0)}


def main(as_json: bool, model: str = "smollm2", chat_template: str | None = None) -> int:
    emit(run(model, chat_template), TARGETS, as_json)
    return 0
