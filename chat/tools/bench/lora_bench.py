"""`turncache bench lora`: multi-turn chats under LoRA adapters and the base model in one engine, against the same
chats on the base model alone.

Four adapters are made with ``peft`` for the model's own config (SmolLM2's for the built-in model: a model of that
config with random weights takes them, ranks 4, 8, 8 and 16 on q/k/v/o/gate/up/down, random A and B, B scaled down
so that replies stay word-like), written as PEFT directories and loaded by path, as ``--lora`` would.

Phases, each on a fresh engine and prefix cache, the same workload (``sessions`` concurrent chats x ``turns`` turns,
user messages of random words; each reply greedy and exactly ``reply_tokens`` long, its end-of-reply tokens banned, so
that every phase generates the same number of tokens; the history's assistant messages are scripted, the same under
every adapter, so that a session's prompts are the same tokens whatever model answers it):

- ``lora``: session ``i`` under adapter ``i % 5`` (the fifth: the base model), all in the same steps;
- ``base``: every session on the base model.

The two phases alternate for ``rounds`` rounds (order reversed every other round). After each ``lora`` phase, a
probe re-sends every session's last prompt (with one token of reply) under every other adapter and the base: a probe
that the cache serves anything of is a cross-adapter hit; the same probe under the session's own adapter is the
control (it must hit).

Keys: ``model``, ``sessions``, ``turns``, ``adapters`` (names and ranks), ``rounds``;
``tokens_per_s_lora`` / ``tokens_per_s_base`` (reply tokens / phase wall time, medians over rounds) and
``lora_tokens_per_s_ratio`` (median of the rounds' lora / base; target >= 0.8); ``cached_ratio`` (per adapter and
``base``: cached / prompt tokens over turns 2.. of its sessions in the lora phase), ``cached_ratio_base_alone`` (the
same sessions' ratio in the base phase) and ``cached_ratio_max_gap`` (the largest difference between the two;
target <= 0.02);
``cross_adapter_hits`` (target 0) and ``own_adapter_probe_hits`` (of ``probes_own``); ``errors`` (target 0);
``swaps_in`` (adapters put into computing form over the run).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import string
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache import shared_prefix_length
from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

GiB = 1024 * 1024 * 1024
SYSTEM = "You are a helpful assistant."
RANKS = (4, 8, 8, 16)
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
B_SCALE = 0.1  # peft's random B (init_lora_weights=False) scaled down: updates that bend the model, not break it


@dataclass(frozen=True)
class LoraBenchConfig:
    sessions: int = 8
    turns: int = 4
    min_user_words: int = 24
    max_user_words: int = 48
    reply_tokens: int = 16
    rounds: int = 2
    seed: int = 0


@dataclass(frozen=True)
class Record:
    session: int
    turn: int
    adapter: str  # adapter name, or "base"
    prompt_tokens: int
    cached_tokens: int
    reply_tokens: int
    error: str | None


# ---------------------------------------------------------------- adapters


def make_adapters(config: Any, where: Path, seed: int = 0) -> list[tuple[str, Path, int]]:
    """Four PEFT adapter directories for a model of ``config``: ``(name, path, rank)``."""
    from chat.tools.testing.peft_adapters import make_peft_adapters

    paths = make_peft_adapters(config, where, RANKS, TARGET_MODULES, B_SCALE, seed)
    return [(f"bench-lora-{i}", path, rank) for i, (path, rank) in enumerate(zip(paths, RANKS, strict=True))]


# ---------------------------------------------------------------- the workload


def make_workload(cfg: LoraBenchConfig) -> list[list[tuple[str, str]]]:
    """Per session, per turn: (user message, the scripted assistant message the history keeps)."""
    rng = random.Random(cfg.seed)

    def words(low: int, high: int) -> str:
        n = rng.randint(low, high)
        return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 7))) for _ in range(n))

    return [
        [(words(cfg.min_user_words, cfg.max_user_words), words(6, 12)) for _ in range(cfg.turns)]
        for _ in range(cfg.sessions)
    ]


async def _done(engine, request):
    from chat.engine.events import Done

    async for event in engine.generate(request):
        if isinstance(event, Done):
            return event
    raise RuntimeError("the engine ended a turn without a Done event")


async def _session(engine, index, messages_in, adapter, name, cfg) -> tuple[list[Record], list[dict]]:
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams

    records: list[Record] = []
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    no_end = tuple((int(e), -100.0) for e in sorted(engine.runtime.eos_token_ids))  # every reply runs its length
    for t, (text, scripted) in enumerate(messages_in):
        messages.append({"role": "user", "content": text})
        params = SamplingParams(max_tokens=cfg.reply_tokens, temperature=0.0, logit_bias=no_end)
        request = TurnRequest(list(messages), params, adapter=adapter)
        try:
            done = await _done(engine, request)
        except Exception as exc:
            records.append(Record(index, t, name, 0, 0, 0, repr(exc)))
            break
        error = repr(done.error) if done.finish_reason == "error" else None
        u = done.usage
        records.append(Record(index, t, name, u.prompt_tokens, u.cached_tokens, u.completion_tokens, error))
        if error is not None:
            break
        messages.append({"role": "assistant", "content": scripted})
    return records, messages


def run_phase(runtime, workload, assignment, cfg) -> tuple[list[Record], float, Any, list[list[dict]]]:
    """Every session on one fresh engine; ``assignment[i]``: session i's adapter (None: base). Returns the records,
    the wall time, the engine (closed: its cache stays readable) and each session's conversation."""
    from cache import PrefixCache
    from chat.engine.engine import Engine

    engine = Engine(runtime, cache=PrefixCache(device_budget_bytes=GiB, host_budget_bytes=0), threads=engine_threads())

    async def everything():
        return await asyncio.gather(
            *(
                _session(engine, i, turns, assignment[i], assignment[i].name if assignment[i] else "base", cfg)
                for i, turns in enumerate(workload)
            )
        )

    try:
        t0 = time.perf_counter()
        results = asyncio.run(everything())
        wall = time.perf_counter() - t0
        return [r for rs, _ in results for r in rs], wall, engine, [m for _, m in results]
    except BaseException:
        engine.close()
        raise


def probe(engine, conversations, assignment, adapters) -> tuple[int, int, int, int, int]:
    """Each session's conversation again under every adapter and the base (one reply token). Sessions share their
    first tokens (the system prompt): a probe may legitimately be served that much from its own namespace. A probe
    served more than that under another adapter (or the base) than the session's own is a cross-adapter hit.
    Returns ``(cross-adapter hits, cross probes, own-adapter hits, own probes, errors)``."""
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams

    runtime = engine.runtime
    prompts = [c[:-1] if c and c[-1]["role"] == "assistant" else c for c in conversations]
    rendered = [runtime.render(p) for p in prompts]
    shared = min(shared_prefix_length(rendered[0], r) for r in rendered[1:]) if len(rendered) > 1 else 0
    choices = [None, *adapters]
    counts = {"cross": 0, "cross_n": 0, "own": 0, "own_n": 0, "errors": 0}

    async def everything():
        for prompt, mine in zip(prompts, assignment, strict=True):
            for other in choices:
                request = TurnRequest(prompt, SamplingParams(max_tokens=1), adapter=other)
                done = await _done(engine, request)
                if done.finish_reason == "error":
                    counts["errors"] += 1
                    continue
                hit = done.usage.cached_tokens > shared
                kind = "own" if other is mine else "cross"
                counts[kind] += hit
                counts[kind + "_n"] += 1

    asyncio.run(everything())
    return counts["cross"], counts["cross_n"], counts["own"], counts["own_n"], counts["errors"]


# ---------------------------------------------------------------- figures


def _tokens_per_s(records: list[Record], wall: float) -> float:
    return sum(r.reply_tokens for r in records if r.error is None) / wall if wall > 0 else 0.0


def _cached_ratio(records: list[Record]) -> float:
    later = [r for r in records if r.turn > 0 and r.error is None]
    return sum(r.cached_tokens for r in later) / max(1, sum(r.prompt_tokens for r in later))


def run_on(runtime, cfg: LoraBenchConfig | None = None, adapter_dir: Path | None = None) -> dict:
    leave_parallelism_to_engines()
    cfg = cfg or LoraBenchConfig()
    bank = getattr(runtime, "adapters", None)
    if bank is None:
        raise SystemExit(f"turncache: {runtime.name} runs on transformers' forward: it serves no LoRA adapters")
    with tempfile.TemporaryDirectory(prefix="turncache-lora-bench-") as tmp:
        where = adapter_dir or Path(tmp)
        made = in_fresh_thread(lambda: make_adapters(runtime._model.config, where, cfg.seed))
        adapters = []
        for name, path, _ in made:
            adapter = bank.read(name, str(path))
            bank.add(adapter, replace=True)
            adapters.append(adapter)
    workload = make_workload(cfg)
    mixed = [adapters[i % 5] if i % 5 < 4 else None for i in range(cfg.sessions)]
    alone = [None] * cfg.sessions
    ratios, tps_lora, tps_base = [], [], []
    lora_records: list[Record] = []
    base_records: list[Record] = []
    cross = cross_n = own = own_n = probe_errors = 0
    for assignment in (mixed, alone):  # untimed: a fresh load's first steps (pages faulted back in after the load's
        # trim, first shapes) would otherwise land on round 0's first phase alone and skew its ratio
        engine = run_phase(runtime, workload, assignment, cfg)[2]
        engine.close()
    for round_ in range(cfg.rounds):
        order = ("base", "lora") if round_ % 2 == 0 else ("lora", "base")
        walls = {}
        for phase in order:
            records, wall, engine, conversations = run_phase(
                runtime, workload, mixed if phase == "lora" else alone, cfg
            )
            try:
                if phase == "lora":
                    c, cn, o, on, e = probe(engine, conversations, mixed, adapters)
                    cross, cross_n, own, own_n, probe_errors = (
                        cross + c,
                        cross_n + cn,
                        own + o,
                        own_n + on,
                        probe_errors + e,
                    )
            finally:
                engine.close()
            walls[phase] = _tokens_per_s(records, wall)
            (lora_records if phase == "lora" else base_records).extend(records)
        tps_lora.append(walls["lora"])
        tps_base.append(walls["base"])
        ratios.append(walls["lora"] / walls["base"] if walls["base"] else 0.0)
    names = ["base", *(a.name for a in adapters)]
    sessions_of = {n: {r.session for r in lora_records if r.adapter == n} for n in names}
    by_adapter = {n: _cached_ratio([r for r in lora_records if r.adapter == n]) for n in names}
    base_alone = {n: _cached_ratio([r for r in base_records if r.session in sessions_of[n]]) for n in names}
    return {
        "model": runtime.name,
        "weights": runtime.weights,  # the format the base and the adapters' products run in (int8 ones: exact)
        "sessions": cfg.sessions,
        "turns": cfg.turns,
        "rounds": cfg.rounds,
        "adapters": {a.name: a.rank for a in adapters},
        "tokens_per_s_lora": statistics.median(tps_lora),
        "tokens_per_s_base": statistics.median(tps_base),
        "lora_tokens_per_s_ratio": statistics.median(ratios),
        "lora_tokens_per_s_ratio_rounds": ratios,
        "cached_ratio": by_adapter,
        "cached_ratio_base_alone": base_alone,
        "cached_ratio_max_gap": max(abs(by_adapter[n] - base_alone[n]) for n in names),
        "cross_adapter_hits": cross,
        "probes_cross": cross_n,
        "own_adapter_probe_hits": own,
        "probes_own": own_n,
        "errors": sum(r.error is not None for r in lora_records + base_records) + probe_errors,
        "swaps_in": bank.swaps_in,
    }


TARGETS = {
    "lora_tokens_per_s_ratio": (">=", 0.8),
    "cached_ratio_max_gap": ("<=", 0.02),
    "cross_adapter_hits": ("==", 0),
    "errors": ("==", 0),
}


def main(as_json: bool, model: str = "smollm2", sessions: int | None = None, rounds: int | None = None) -> int:
    from chat.models import load_model

    cfg = LoraBenchConfig()
    if sessions is not None:
        cfg = LoraBenchConfig(sessions=sessions, rounds=cfg.rounds)
    if rounds is not None:
        cfg = LoraBenchConfig(sessions=cfg.sessions, rounds=rounds)
    emit(run_on(in_fresh_thread(lambda: load_model(model)), cfg), TARGETS, as_json)
    return 0
