"""`turncache bench multiturn`: concurrent multi-turn chats shaped like SGLang's multi-turn chat benchmark.

SGLang's ``benchmark/multi_turn_chat`` runs 20 conversations x 4 turns, all in flight at once; each turn is a user
message of 256-512 tokens and a greedy reply of 4-8 tokens (its "short output" mode). Here the same shape is scaled
to a 2-core CPU: ``conversations`` (8 by default) x ``turns_per_conversation`` (4) on one engine, which interleaves
them one step (a prefill chunk or one token) at a time. The identical workload runs twice in the same process, with
the prefix cache and without it (``--no-prefix-cache``), after one warm-up turn.

User messages are space-separated random lowercase words, their lengths measured with the model's own chat
template (the message rendered alone, minus an empty message). Reply budgets are drawn per turn; a reply may end
earlier at EOS. Time to first token is measured from the moment the turn is submitted, so it includes waiting
behind the other conversations' steps, as a user would see it.

Keys: ``model``, ``conversations``, ``turns_per_conversation``, ``turns`` (per mode), ``errors`` (both modes),
``user_tokens_min`` / ``user_tokens_max`` / ``reply_tokens_max`` (the workload's bounds),
``ttft_p50_ms_cache`` / ``ttft_p50_ms_nocache`` (all turns) and ``speedup`` (nocache / cache),
``cached_token_ratio`` (cached / prompt tokens over all turns, with the cache), ``wall_s_cache`` / ``wall_s_nocache``,
``same_replies`` (fraction of turns whose reply was the same in both modes), and per turn (lists indexed by turn):
``ttft_p50_ms_per_turn_cache``, ``ttft_p50_ms_per_turn_nocache``, ``cached_token_ratio_per_turn_cache``,
``cached_token_ratio_per_turn_nocache``, ``prompt_tokens_mean_per_turn``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass

from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

GiB = 1024 * 1024 * 1024
SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class MultiTurnConfig:
    conversations: int = 8  # SGLang: 20
    turns_per_conversation: int = 4
    min_user_tokens: int = 256
    max_user_tokens: int = 512
    min_reply_tokens: int = 4
    max_reply_tokens: int = 8
    parallel: int | None = None  # conversations in flight at once (None: all of them, as SGLang's default does)
    seed: int = 0


@dataclass(frozen=True)
class Turn:
    user: str  # the user message
    user_tokens: int  # its length in tokens (rendered alone, template overhead subtracted)
    reply_budget: int  # max_tokens of the reply


@dataclass(frozen=True)
class TurnRecord:
    conversation: int
    turn: int  # 0-based
    user_tokens: int
    prompt_tokens: int
    cached_tokens: int
    reply_tokens: int
    ttft_ms: float | None
    reply: str
    error: str | None = None


# ---------------------------------------------------------------- the workload


def message_tokens(runtime, text: str) -> int:
    """Tokens ``text`` adds as a user message under the runtime's chat template."""
    empty = runtime.render([{"role": "user", "content": ""}], add_generation_prompt=False)
    return len(runtime.render([{"role": "user", "content": text}], add_generation_prompt=False)) - len(empty)


def user_message(runtime, rng: random.Random, target: int, floor: int) -> tuple[str, int]:
    """Random words whose token count is at most ``target`` and at least ``floor``; returns (text, tokens)."""
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 7))) for _ in range(target)]
    low, high = 1, len(words)  # every word is at least one token: ``target`` words are enough
    while low < high:  # the most words whose text stays within ``target`` tokens
        mid = (low + high + 1) // 2
        if message_tokens(runtime, " ".join(words[:mid])) <= target:
            low = mid
        else:
            high = mid - 1
    text = " ".join(words[:low])
    count = message_tokens(runtime, text)
    while count < floor:  # a long last word fell short of the floor: pad with letters
        text += rng.choice(string.ascii_lowercase)
        count = message_tokens(runtime, text)
    return text, count


def make_workload(runtime, cfg: MultiTurnConfig) -> list[list[Turn]]:
    """``cfg.conversations`` lists of ``cfg.turns_per_conversation`` turns, seeded."""
    rng = random.Random(cfg.seed)
    out = []
    for _ in range(cfg.conversations):
        turns = []
        for _ in range(cfg.turns_per_conversation):
            target = rng.randint(cfg.min_user_tokens, cfg.max_user_tokens)
            text, count = user_message(runtime, rng, target, cfg.min_user_tokens)
            turns.append(Turn(text, count, rng.randint(cfg.min_reply_tokens, cfg.max_reply_tokens)))
        out.append(turns)
    return out


# ---------------------------------------------------------------- running it


async def _reply(engine, request):
    """The turn's Done event (the streamed deltas are dropped)."""
    from chat.engine.events import Done

    async for event in engine.generate(request):
        if isinstance(event, Done):
            return event
    raise RuntimeError("the engine ended a turn without a Done event")


async def _conversation(engine, index: int, turns: Sequence[Turn], gate: asyncio.Semaphore) -> list[TurnRecord]:
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams

    records: list[TurnRecord] = []
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    async with gate:
        for t, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn.user})
            request = TurnRequest(list(messages), SamplingParams(max_tokens=turn.reply_budget))
            try:
                done = await _reply(engine, request)
            except Exception as exc:  # the conversation cannot go on without this reply
                records.append(TurnRecord(index, t, turn.user_tokens, 0, 0, 0, None, "", repr(exc)))
                break
            error = repr(done.error) if done.finish_reason == "error" else None
            u = done.usage
            ttft = done.timings.ttft_ms if error is None else None
            records.append(
                TurnRecord(
                    index,
                    t,
                    turn.user_tokens,
                    u.prompt_tokens,
                    u.cached_tokens,
                    u.completion_tokens,
                    ttft,
                    done.text,
                    error,
                )
            )
            if error is not None:
                break
            messages.append({"role": "assistant", "content": done.text})
    return records


def run_workload(runtime, workload: list[list[Turn]], *, cache: bool, parallel: int | None = None):
    """Every conversation of ``workload`` on one fresh engine; returns (records, wall seconds)."""
    from cache import PrefixCache
    from chat.engine.engine import Engine

    engine = Engine(
        runtime,
        cache=PrefixCache(device_budget_bytes=GiB, host_budget_bytes=0) if cache else None,
        threads=engine_threads(),
    )

    async def everything() -> list[list[TurnRecord]]:
        gate = asyncio.Semaphore(parallel or len(workload) or 1)
        return await asyncio.gather(*(_conversation(engine, i, turns, gate) for i, turns in enumerate(workload)))

    try:
        t0 = time.perf_counter()
        results = asyncio.run(everything())
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    return [r for rs in results for r in rs], wall


# ---------------------------------------------------------------- figures


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratio(records: list[TurnRecord]) -> float:
    return sum(r.cached_tokens for r in records) / max(1, sum(r.prompt_tokens for r in records))


def _per_turn(records: list[TurnRecord], turns: int) -> list[list[TurnRecord]]:
    return [[r for r in records if r.turn == t and r.error is None] for t in range(turns)]


def summarize(cfg: MultiTurnConfig, hit: list[TurnRecord], miss: list[TurnRecord]) -> dict:
    """The benchmark's keys from the records of the cached run (``hit``) and the uncached run (``miss``)."""
    n = cfg.turns_per_conversation
    ok_hit = [r for r in hit if r.error is None]
    ok_miss = [r for r in miss if r.error is None]
    p50_hit, p50_miss = _p50([r.ttft_ms for r in ok_hit]), _p50([r.ttft_ms for r in ok_miss])
    replies = {(r.conversation, r.turn): r.reply for r in ok_miss}
    same = [replies.get((r.conversation, r.turn)) == r.reply for r in ok_hit]
    by_turn_hit, by_turn_miss = _per_turn(hit, n), _per_turn(miss, n)
    return {
        "conversations": cfg.conversations,
        "turns_per_conversation": n,
        "turns": len(hit),
        "errors": sum(r.error is not None for r in hit + miss),
        "user_tokens_min": min((r.user_tokens for r in hit), default=0),
        "user_tokens_max": max((r.user_tokens for r in hit), default=0),
        "reply_tokens_max": cfg.max_reply_tokens,
        "ttft_p50_ms_cache": p50_hit,
        "ttft_p50_ms_nocache": p50_miss,
        "speedup": p50_miss / p50_hit,
        "cached_token_ratio": _ratio(ok_hit),
        "same_replies": sum(same) / max(1, len(same)),
        "ttft_p50_ms_per_turn_cache": [_p50([r.ttft_ms for r in rs]) for rs in by_turn_hit],
        "ttft_p50_ms_per_turn_nocache": [_p50([r.ttft_ms for r in rs]) for rs in by_turn_miss],
        "cached_token_ratio_per_turn_cache": [_ratio(rs) for rs in by_turn_hit],
        "cached_token_ratio_per_turn_nocache": [_ratio(rs) for rs in by_turn_miss],
        "prompt_tokens_mean_per_turn": [
            statistics.fmean(r.prompt_tokens for r in rs) if rs else 0 for rs in by_turn_hit
        ],
    }


def run_on(runtime, cfg: MultiTurnConfig | None = None) -> dict:
    """The benchmark on an already loaded runtime: warm-up, then the workload with the cache, then without."""
    leave_parallelism_to_engines()  # torch runs in parallel in the engine's worker only (chat.tools.bench.threads)
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams
    from chat.engine.turn import Turn, run_to_end

    cfg = cfg or MultiTurnConfig()
    workload = make_workload(runtime, cfg)
    run_to_end(Turn(runtime, None, TurnRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))))
    hit, wall_hit = run_workload(runtime, workload, cache=True, parallel=cfg.parallel)
    miss, wall_miss = run_workload(runtime, workload, cache=False, parallel=cfg.parallel)
    return {
        "model": runtime.name,
        **summarize(cfg, hit, miss),
        "wall_s_cache": wall_hit,
        "wall_s_nocache": wall_miss,
    }


TARGETS = {"errors": ("==", 0), "same_replies": ("==", 1.0)}


def main(
    as_json: bool, model: str = "smollm2", conversations: int | None = None, chat_template: str | None = None
) -> int:
    from chat.models import load_model

    cfg = MultiTurnConfig() if conversations is None else MultiTurnConfig(conversations=conversations)
    emit(run_on(in_fresh_thread(lambda: load_model(model, chat_template=chat_template)), cfg), TARGETS, as_json)
    return 0
