"""`turncache bench batch`: aggregate decode throughput against the number of concurrent sessions, one run.

The workload: ordinary chat questions (an open request for a story, an explanation, a plan) whose greedy replies run for
``reply_tokens`` tokens (64) without repeating their context, so speculative decoding has little to copy. At each level
of 1, 2, 4, 8, 16 and 32 concurrent sessions, every session asks one question at the same moment on one engine (the
server's, without the network, with an empty cache), and the level's aggregate rate is all completion tokens over its
wall time. Each level runs ``rounds`` times (3) on a fresh engine and reports the median: one round of one session is a
single 0.7 s reply, which other work on a 2-core machine can slow by a third. Then, on the same prompts and in the same
run: one session alone with speculation off and on, and stock transformers ``generate`` in float32 (the model as loaded
from disk, no prefix cache). Torch runs in parallel only in the engines' workers and in a short-lived thread for
``generate`` (:mod:`chat.tools.bench.threads`).

Keys: ``model``, ``weights`` (the engine's weight format), ``levels``, ``aggregate_tokens_per_s`` and ``ttft_p50_ms``
(lists, one per level: medians over the rounds), ``rounds``, ``single_stream_tokens_per_s`` (speculation off) and
``single_stream_spec_tokens_per_s`` (speculation on): decode rates (tokens after the first over the time after the
first, median over prompts); ``hf_generate_tokens_per_s``: the same rate for ``generate`` (its time for N tokens minus
its time for 1, median); ``max_batch`` and ``token_budget`` (the scheduler's settings); ``threads`` (torch threads of
each engine); ``errors``.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

LEVELS = (1, 2, 4, 8, 16, 32)
SUBJECTS = (
    "a lighthouse keeper who finds a message in a bottle",
    "how bread rises in the oven",
    "a plan for a week of cheap and healthy dinners",
    "why the sky looks blue during the day and red at sunset",
    "a robot that learns to paint",
    "the rules of chess for a complete beginner",
    "a village that runs out of water",
    "how to prepare for a first job interview",
)
ASKS = ("Write a short story about", "Explain in simple words", "Give me a detailed answer about", "Tell me about")


def prompts(n: int) -> list[list[dict]]:
    """``n`` single-question conversations, all different."""
    out = []
    for i in range(n):
        ask, subject = ASKS[i % len(ASKS)], SUBJECTS[(i * 3) % len(SUBJECTS)]
        out.append([{"role": "user", "content": f"{ask} {subject}. (Request {i + 1}.)"}])
    return out


def finish_all(engine, conversations: list[list[dict]], reply_tokens: int) -> tuple[float, list]:
    """Every conversation submitted at once on ``engine``; (wall seconds until the last ended, each one's Done or
    exception, in the order they ended)."""
    from chat.engine.events import Done, TurnRequest
    from chat.engine.sampling import SamplingParams

    finished = threading.Event()
    lock = threading.Lock()
    ends: list[Done | BaseException] = []

    def sink(event) -> None:
        if isinstance(event, Done | BaseException):
            with lock:
                ends.append(event)
                if len(ends) == len(conversations):
                    finished.set()

    start = time.perf_counter()
    for messages in conversations:
        engine.submit(TurnRequest(messages, SamplingParams(max_tokens=reply_tokens)), sink)
    finished.wait()
    return time.perf_counter() - start, ends


def run_level(engine, conversations: list[list[dict]], reply_tokens: int) -> tuple[float, list[float], int, int]:
    """All conversations at once on ``engine``; (wall seconds, TTFTs in ms, completion tokens, errors)."""
    from chat.engine.events import Done

    wall, ends = finish_all(engine, conversations, reply_tokens)
    ok = [d for d in ends if isinstance(d, Done) and d.finish_reason in ("stop", "length")]
    return wall, [d.timings.ttft_ms for d in ok], sum(d.usage.completion_tokens for d in ok), len(ends) - len(ok)


def single_stream(runtime, conversations: list[list[dict]], reply_tokens: int, draft_tokens: int) -> list[float]:
    """Decode rates of each conversation run alone on an engine (speculation on or off)."""
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.scheduler import BatchSettings

    rates = []
    for messages in conversations:
        engine = Engine(
            runtime, cache=PrefixCache(), batch=BatchSettings(draft_tokens=draft_tokens), threads=engine_threads()
        )
        try:
            _, (done,) = finish_all(engine, [messages], reply_tokens)
        finally:
            engine.close()
        if isinstance(done, BaseException):
            raise done
        rates.append(done.timings.decode_tokens_per_s)
    return rates


HF_REPEATS = 3  # each of hf_rates' two timings is the fastest of this many runs


def hf_rates(model: str, conversations: list[list[dict]], reply_tokens: int) -> list[float]:
    """Stock transformers ``generate`` in float32: (N - 1) tokens over (time for N - time for 1), each time the
    fastest of ``HF_REPEATS`` runs (one run each could put a slow 1-token run above a fast N-token one on a busy
    machine: a negative rate)."""
    from chat.tools.testing.baselines import hf_generate, load_stock

    stock = load_stock(model)
    rates = []
    for messages in conversations:
        prompt = stock.render(messages)
        first = min(_timed(hf_generate, stock, prompt, 1)[0] for _ in range(HF_REPEATS))
        runs = [_timed(hf_generate, stock, prompt, reply_tokens) for _ in range(HF_REPEATS)]
        total, produced = min(runs, key=lambda run: run[0])
        rates.append((len(produced) - 1) / (total - first))
    return rates


def _timed(call, *args) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call(*args)
    return time.perf_counter() - start, result


def run(
    model: str = "smollm2",
    *,
    levels: tuple[int, ...] = LEVELS,
    reply_tokens: int = 64,
    weights: str | None = None,
    max_batch: int | None = None,
    token_budget: int | None = None,
    rounds: int = 3,
) -> dict:
    """The benchmark. Torch runs in parallel only inside the engines' workers and in short-lived threads
    (chat.tools.bench.threads): this thread stays single-threaded."""
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.scheduler import BatchSettings
    from chat.models import load_model

    leave_parallelism_to_engines()
    runtime = in_fresh_thread(lambda: load_model(model, weights=weights))
    settings = BatchSettings(**{k: v for k, v in (("max_batch", max_batch), ("token_budget", token_budget)) if v})
    sample = prompts(4)
    single_stream(runtime, sample[:1], 4, 0)  # warm-up: every weight touched once
    rates, ttfts, errors = [], [], 0
    for n in levels:
        round_rates, round_ttfts = [], []
        for _ in range(rounds):
            engine = Engine(runtime, cache=PrefixCache(), batch=settings, threads=engine_threads())
            try:
                wall, level_ttfts, tokens, failed = run_level(engine, prompts(n), reply_tokens)
            finally:
                engine.close()
            round_rates.append(tokens / wall)
            round_ttfts.append(statistics.median(level_ttfts) if level_ttfts else float("nan"))
            errors += failed
        rates.append(statistics.median(round_rates))
        ttfts.append(statistics.median(round_ttfts))
    plain = single_stream(runtime, sample, reply_tokens, 0)
    spec = single_stream(runtime, sample, reply_tokens, settings.draft_tokens)
    weights_used = runtime.weights
    del runtime
    hf = in_fresh_thread(lambda: hf_rates(model, sample, reply_tokens))
    return {
        "model": model,
        "weights": weights_used,
        "levels": list(levels),
        "aggregate_tokens_per_s": rates,
        "ttft_p50_ms": ttfts,
        "rounds": rounds,
        "single_stream_tokens_per_s": statistics.median(plain),
        "single_stream_spec_tokens_per_s": statistics.median(spec),
        "hf_generate_tokens_per_s": statistics.median(hf),
        "max_batch": settings.max_batch,
        "token_budget": settings.token_budget,
        "threads": engine_threads(),
        "errors": errors,
    }


def targets_met(result: dict) -> dict[str, bool]:
    """The issue's targets, checked on one result."""
    levels, rates = result["levels"], result["aggregate_tokens_per_s"]
    at = dict(zip(levels, rates, strict=True))
    out = {"errors == 0": result["errors"] == 0}
    if 1 in at and 8 in at:
        out["aggregate at 8 >= 5 x aggregate at 1"] = at[8] >= 5 * at[1]
    out["single stream >= 3 x hf generate"] = (
        result["single_stream_tokens_per_s"] >= 3 * result["hf_generate_tokens_per_s"]
    )
    return out


TARGETS = {"errors": ("==", 0)}


def main(as_json: bool, model: str = "smollm2") -> int:
    result = run(model)
    if not as_json:
        result = {**result, **{f"target: {k}": v for k, v in targets_met(result).items()}}
    emit(result, TARGETS, as_json)
    return 0
