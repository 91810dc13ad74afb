"""`turncache bench load`: 32 concurrent WebSocket sessions x 5 turns against a loopback server, one run.

Keys: ``sessions``, ``turns``, ``errors``, ``turns_per_s`` and ``completion_tokens_per_s`` (throughput over the run),
``ttft_p50_ms``, ``ttft_p99_ms``, ``rss_before_mib`` (after a warm-up turn, so the weights are resident),
``rss_peak_mib`` (sampled every 100 ms during the run), ``rss_after_mib`` (sessions closed, freed heap returned),
``rss_growth_mib`` (after - before), ``rss_after_second_round_mib`` and ``rss_growth_second_round_mib`` (the same load
run again: a leak would grow again), ``errors_second_round``, ``cache_bytes_after_mib`` and ``cache_budget_mib`` (the
prefix cache's bytes after the run and its configured budget: growth should stay about within the budget),
``ttft_ms_samples`` (every turn's time to first token in the first round, sorted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from chat.tools.bench.report import emit
from chat.tools.bench.serve_bench import _pct, _session
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

MiB = 1024 * 1024


def settled_rss_mib() -> float:
    """Resident memory after returning freed heap pages to the system (glibc keeps them otherwise)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def rss_mib() -> float:
    """Resident memory of this process (the server runs in it), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _run(url: str, sessions: int, turns: int, short_tokens: int) -> dict:
    peak = rss_mib()
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_mib())
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(
            _session(url, turns, long=False, short_tokens=short_tokens, long_tokens=0, offset=i)
            for i in range(sessions)
        ),
        return_exceptions=True,
    )
    wall = time.perf_counter() - t0
    stop.set()
    await sampler
    flat = [r for rs in results if not isinstance(rs, BaseException) for r in rs]
    failed_sessions = sum(1 for rs in results if isinstance(rs, BaseException))
    ttfts = [r.ttft_ms for r in flat if r.ttft_ms is not None]
    return {
        "sessions": sessions,
        "turns": len(flat),
        "errors": sum(1 for r in flat if r.error is not None) + failed_sessions * turns,
        "wall_s": wall,
        "turns_per_s": len(flat) / wall,
        "ttft_p50_ms": _pct(ttfts, 0.5) if ttfts else float("nan"),
        "ttft_p99_ms": _pct(ttfts, 0.99) if ttfts else float("nan"),
        "rss_peak_mib": peak,
        "ttft_ms_samples": sorted(ttfts),
    }


def run_on(runtime, *, sessions: int = 32, turns: int = 5, short_tokens: int = 24, cache_mib: int = 256) -> dict:
    leave_parallelism_to_engines()  # torch runs in parallel in the engine's worker only (chat.tools.bench.threads)
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams
    from chat.engine.turn import Turn, run_to_end
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    # warm up: touch every weight once, so that "before" is the resident size of a serving process
    run_to_end(Turn(runtime, None, TurnRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))))
    engine = Engine(
        runtime, cache=PrefixCache(device_budget_bytes=cache_mib * MiB, host_budget_bytes=0), threads=engine_threads()
    )
    try:
        before = rss_mib()
        tokens_before = engine.metrics.completion_tokens
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
            url = server.url.replace("http://", "ws://") + "/v1/ws"
            result = asyncio.run(_run(url, sessions, turns, short_tokens))
            after = settled_rss_mib()
            generated = engine.metrics.completion_tokens - tokens_before  # the first round's tokens only
            # the same load again: a leak grows once more, a warmed-up allocator does not
            second = asyncio.run(_run(url, sessions, turns, short_tokens))
            after_second = settled_rss_mib()
        stats = engine.cache_stats()
    finally:
        engine.close()
    return {
        "model": runtime.name,
        **result,
        "completion_tokens_per_s": generated / result["wall_s"],
        "rss_before_mib": before,
        "rss_after_mib": after,
        "rss_growth_mib": after - before,
        "rss_after_second_round_mib": after_second,
        "rss_growth_second_round_mib": after_second - after,
        "errors_second_round": second["errors"],
        "cache_bytes_after_mib": stats.bytes_per_tier["device"] / MiB,
        "cache_budget_mib": cache_mib,
    }


TARGETS = {"errors": ("==", 0), "completion_tokens_per_s": (">=", 100.0), "ttft_p50_ms": ("<=", 1000.0)}


def main(as_json: bool, model: str = "smollm2", chat_template: str | None = None) -> int:
    from chat.models import load_model

    emit(run_on(in_fresh_thread(lambda: load_model(model, chat_template=chat_template))), TARGETS, as_json)
    return 0
