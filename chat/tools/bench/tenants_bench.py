"""`turncache bench tenants`: a quiet tenant's chat while a noisy tenant runs a batch eval on the same server.

One loopback server (in this process, over HTTP) with a keys file of two tenants:

- **quiet** (A): ``quiet_sessions`` (2) interactive chat sessions of ``quiet_turns`` (10) turns each, both at once.
  Each turn is a streaming ``POST /v1/chat/completions`` carrying the whole conversation (a short question, a reply of
  at most ``quiet_reply_tokens`` tokens, greedy), then ``think_s`` seconds of reading before the next question. Its
  time to first token is measured by the client: from sending the request to the first server-sent event (the server
  sends it once the reply's first token exists, ``chat/server/surfaces/openai_api.py``).
- **noisy** (B): ``noisy_conversations`` (32) eval workers, all at once. Each runs eval conversations back to back
  (non-streaming requests of the whole history, ``noisy_turns`` user messages of ``noisy_user_tokens`` random words,
  replies of at most ``noisy_reply_tokens`` tokens, every conversation's system message tagged with its number, so
  none shares a prefix with another) until the measurement ends. B's keys-file entry sets ``concurrent_turns`` to
  ``noisy_concurrent_turns`` (8): 32 workers exceed it, so the server answers some requests 429. **Retry-After is
  honoured**: a refused request is sent again, unchanged, after the header's seconds (each 429 is counted in
  ``rate_limited``; a 429 is not an error). B's workers run in a child process (:mod:`chat.tools.bench.noisy_client`),
  so that their own HTTP and JSON work does not take the GIL from the server's event loop and the engine's worker:
  the benchmark measures the server, not its own client. A's two sessions run in this process.

**Cache budget.** The device tier's budget is sized so that B's 32 conversations alone fill it ``cache_fills`` (4)
times over: a probe run of the model gives its state's bytes per token (:func:`state_bytes_per_token`); a
conversation of ``L`` tokens (its planned length: the rendered messages plus every reply at its cap) holds at least
``ceil(L / 256) * 256`` rows of that (the engine's K/V buffers hold whole multiples of ``ROW_ALIGN`` = 256 rows,
``chat/models/kv_rows.py``); the budget is the 32 conversations' bytes / ``cache_fills``. That is a lower bound of
what they hold, so they fill it at least that often; ``noisy_cache_fills`` reports the same for every conversation B
finished in the run, at its measured length. A's two sessions, planned the same way, need ``quiet_cache_mib_planned``
(they fit in their share when it is below ``tenant_share * cache_budget_mib``).
The host tier is 0 and there is no disk tier, so whatever leaves the device tier is gone. Tenant shares are on
(``tenant_share``, 0.5: ``--tenant-cache-share``): B over its share loses its entries before A loses any of its own.

**Phases, one run, one server, same settings**: a warm-up request, then A alone; then B starts, and once B has
finished as many turns as it may run at once (it is in steady state) A runs again under B's load, with A's keys-file
entry giving its turns ``quiet_priority`` (-10: sooner, see ``chat/engine/scheduler.py``); then, with
``quiet_priority`` not 0, A's priority is taken out of the keys file (reloaded in place, as SIGHUP does) and A runs a
third time under the same load. Each phase's sessions are new (their system message tagged with the phase), so no
phase finds another's prefixes in the cache.

Keys (stable): ``quiet_ttft_p50_ratio`` (A's first-token p50 under B's load, with its priority / A alone; target <=
1.5), ``quiet_cached_ratio`` (A's cached / prompt tokens over turns 2+ under B's load; target >= 0.9),
``noisy_tokens_per_s`` (B's completion tokens per second while it ran), ``rate_limited`` (429s B got), ``errors``
(failed requests of either tenant, 429s not counted; target 0).

Also: ``quiet_ttft_p50_ms_alone``, ``quiet_ttft_p50_ms_loaded``, ``quiet_cached_ratio_alone``,
``quiet_ttft_p50_ms_loaded_no_priority``, ``quiet_ttft_p50_ratio_no_priority`` and ``quiet_cached_ratio_no_priority``
(the third phase; absent with ``quiet_priority`` 0), ``quiet_server_ttft_p50_ms_alone`` / ``_loaded`` (the server's
own ``timings.ttft_ms``, without HTTP), ``noisy_turns_done`` (B's requests answered), ``noisy_conversations_done``,
``noisy_prompt_tokens_per_s``, ``noisy_cache_fills`` (K/V of every B conversation of the run / the budget),
``noisy_cache_fills_planned`` (of its first 32), ``quiet_cache_mib_planned``, ``cache_budget_mib``,
``state_bytes_per_token``, ``cache_bytes_quiet_mib`` / ``cache_bytes_noisy_mib`` (what each tenant held at the end),
``cache_evictions``, the settings (``quiet_*``, ``noisy_*``, ``tenant_share``, the server's ``token_budget``,
``yield_budget``, ``yield_hold_s`` and ``threads``, ``retry_after``), ``model``, ``date``, ``cpu``, ``wall_s``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from chat.tools.bench import noisy_client
from chat.tools.bench.constrained_bench import cpu_model
from chat.tools.bench.multiturn_bench import user_message
from chat.tools.bench.noisy_client import NOISY_KEY, NoisyChild, NoisyPlan, NoisyTally, noisy_system
from chat.tools.bench.report import emit
from chat.tools.bench.serve_bench import QUESTIONS
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

MiB = 1024 * 1024
QUIET_KEY = "quiet-tenant-bench-key-0001"  # tenant "quiet" (A)
QUIET_SYSTEM = (  # an application's instructions, as chat apps send them with every request
    "You are the help desk assistant of a small bookshop. Answer the customer's questions in one or two short, "
    "friendly sentences. If a question is about an order, ask for the order number first. Never invent prices, "
    "opening hours or stock levels; say that you will check instead. Recommend books only when asked, and then at "
    "most three, each with its author. Keep a polite tone even when the customer is rude, and do not repeat what "
    "you said earlier in the conversation."
)
QUIET_PHASES = ("alone", "loaded", "unprioritized")  # A's phases, as _measure names them
PROBE_TOKENS = 8  # tokens of the probe run that measures the state's bytes per token


@dataclass(frozen=True)
class TenantsConfig:
    quiet_sessions: int = 2  # A's chat sessions, at once
    quiet_turns: int = 10  # turns of each
    quiet_reply_tokens: int = 24  # A's max_tokens
    think_s: float = 0.5  # A's pause between a reply and the next question
    quiet_priority: int = -10  # A's default priority in the keys file (lower: sooner); 0: none, no third phase
    noisy_conversations: int = 32  # B's eval workers, at once
    noisy_turns: int = 3  # user messages of each eval conversation
    noisy_user_tokens: int = 160  # tokens of each of B's user messages
    noisy_reply_tokens: int = 16  # B's max_tokens
    noisy_concurrent_turns: int = 8  # B's concurrent_turns in the keys file
    cache_fills: float = 4.0  # B's 32 conversations hold this many device budgets
    tenant_share: float | None = 0.5  # --tenant-cache-share (None: shares off)
    token_budget: int | None = None  # the server's --token-budget (None: its default, 256)
    yield_budget: int | None = None  # the server's --yield-budget (None: its default, 16)
    yield_hold_s: float | None = None  # the server's --yield-hold-s (None: its default, 10)
    threads: int | None = None  # torch threads of the server's engine (None: every core, as serve's default)
    seed: int = 0

    def __post_init__(self) -> None:
        """Raises :class:`TenantsSettingError` naming the first setting out of range."""
        from chat.engine.scheduler import TOKEN_BUDGET_RANGE, YIELD_BUDGET_RANGE, YIELD_HOLD_RANGE
        from chat.protocol.limits import MAX_PRIORITY

        counts = ("quiet_sessions", "quiet_turns", "quiet_reply_tokens", "noisy_conversations", "noisy_turns")
        counts += ("noisy_user_tokens", "noisy_reply_tokens", "noisy_concurrent_turns")
        for name in counts:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TenantsSettingError(name, f"must be an integer >= 1, got {value!r}")
        if not -MAX_PRIORITY <= self.quiet_priority <= MAX_PRIORITY:
            raise TenantsSettingError("quiet_priority", f"must be in [{-MAX_PRIORITY}, {MAX_PRIORITY}]")
        low, high = TOKEN_BUDGET_RANGE
        if self.token_budget is not None and not low <= self.token_budget <= high:
            raise TenantsSettingError("token_budget", f"must be in [{low}, {high}]")
        least, most = YIELD_BUDGET_RANGE
        if self.yield_budget is not None and not (self.yield_budget == 0 or least <= self.yield_budget <= most):
            raise TenantsSettingError("yield_budget", f"must be 0 (off) or in [{least}, {most}]")
        if self.yield_hold_s is not None and not 0 <= self.yield_hold_s <= YIELD_HOLD_RANGE[1]:
            raise TenantsSettingError("yield_hold_s", f"must be in [0, {YIELD_HOLD_RANGE[1]:g}]")
        if self.threads is not None and (isinstance(self.threads, bool) or not 1 <= self.threads <= 256):
            raise TenantsSettingError("threads", "must be an integer in [1, 256]")
        if self.tenant_share is not None and not 0 < self.tenant_share <= 1:
            raise TenantsSettingError("tenant_share", "must be in (0, 1]")
        if not self.cache_fills > 0 or self.think_s < 0:
            raise TenantsSettingError("cache_fills" if not self.cache_fills > 0 else "think_s", "out of range")


class TenantsSettingError(ValueError):
    """A setting of the benchmark is out of range; ``name`` says which."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name  # the TenantsConfig field


@dataclass
class QuietTurn:
    """One of A's turns, as its client saw it."""

    turn: int  # 0-based
    ttft_ms: float | None  # request sent -> first event
    server_ttft_ms: float | None  # the server's timings.ttft_ms
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None


# ---------------------------------------------------------------- sizing


def state_bytes_per_token(runtime) -> float:
    """Bytes of the model's cached state per token, from the state a probe run of :data:`PROBE_TOKENS` tokens exports
    (the tensors as the cache stores them, not their buffers' spare rows). Runs torch: call it off the engine."""
    from cache.layers import tensors_of
    from chat.engine.runtime import Feed

    run = runtime.new_run()
    try:
        tokens = runtime.encode("The quick brown fox jumps over the lazy dog again and again.")[:PROBE_TOKENS]
        runtime.forward_batch([Feed(run, tokens, 1)])
        states = runtime.export(run)
    finally:
        runtime.close_run(run)
    return sum(t.nbytes for state in states for t in tensors_of(state)) / len(tokens)


def noisy_messages(runtime, cfg: TenantsConfig) -> list[list[str]]:
    """The user messages of B's first ``noisy_conversations`` conversations (later ones reuse them under another
    system tag): random words of about ``noisy_user_tokens`` tokens each, seeded."""
    rng = random.Random(cfg.seed)
    floor = max(1, cfg.noisy_user_tokens * 3 // 4)
    return [
        [user_message(runtime, rng, cfg.noisy_user_tokens, floor)[0] for _ in range(cfg.noisy_turns)]
        for _ in range(cfg.noisy_conversations)
    ]


def planned_tokens(runtime, system: str, messages: list[str], reply_tokens: int) -> int:
    """Tokens of a whole conversation: its messages rendered (empty replies) plus every reply at its cap."""
    conversation = [{"role": "system", "content": system}]
    for text in messages:
        conversation += [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
    return len(runtime.render(conversation, add_generation_prompt=False)) + reply_tokens * len(messages)


def held_rows(tokens: int) -> int:
    """The fewest K/V buffer rows a sequence of ``tokens`` tokens is held in (a whole multiple of ROW_ALIGN)."""
    from chat.models.kv_rows import ROW_ALIGN

    return noisy_client.held_rows(tokens, ROW_ALIGN)


def quiet_questions(session: int, turns: int) -> list[str]:
    return [QUESTIONS[(session * 3 + turn) % len(QUESTIONS)] for turn in range(turns)]


def quiet_system(phase: str, session: int) -> str:
    return f"[{phase} {session}] {QUIET_SYSTEM}"


def keys_file(path: Path, cfg: TenantsConfig, *, priority: bool) -> None:
    """The two tenants' keys and B's limit (and A's priority, if ``priority``)."""
    tenants: dict[str, dict] = {"noisy": {"concurrent_turns": cfg.noisy_concurrent_turns}}
    if priority and cfg.quiet_priority:
        tenants["quiet"] = {"priority": cfg.quiet_priority}
    path.write_text(json.dumps({QUIET_KEY: "quiet", NOISY_KEY: "noisy", "tenants": tenants}))


# ---------------------------------------------------------------- the clients


def _headers(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


async def _quiet_turn(client, messages: list[dict], cfg: TenantsConfig, turn: int) -> tuple[QuietTurn, str]:
    """One streamed turn of A; (what it measured, the reply's text)."""
    body = {"messages": messages, "max_tokens": cfg.quiet_reply_tokens, "temperature": 0.0, "stream": True}
    start = time.perf_counter()
    ttft, text, usage, timings = None, [], None, {}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=_headers(QUIET_KEY)) as response:
        if response.status_code != 200:
            await response.aread()
            return QuietTurn(turn, None, None, 0, 0, f"HTTP {response.status_code}: {response.text[:200]}"), ""
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if ttft is None:
                ttft = (time.perf_counter() - start) * 1e3
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return QuietTurn(turn, None, None, 0, 0, f"stream error: {chunk['error']}"), ""
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
            usage, timings = chunk.get("usage", usage), chunk.get("timings", timings)
    if usage is None:
        return QuietTurn(turn, None, None, 0, 0, "the stream ended without usage"), ""
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return QuietTurn(turn, ttft, timings.get("ttft_ms"), usage["prompt_tokens"], cached), "".join(text)


async def _quiet_session(client, cfg: TenantsConfig, phase: str, session: int) -> list[QuietTurn]:
    messages = [{"role": "system", "content": quiet_system(phase, session)}]
    out = []
    for turn, question in enumerate(quiet_questions(session, cfg.quiet_turns)):
        messages.append({"role": "user", "content": question})
        try:
            record, reply = await _quiet_turn(client, messages, cfg, turn)
        except Exception as exc:  # counted; the session cannot go on without this reply
            out.append(QuietTurn(turn, None, None, 0, 0, f"{type(exc).__name__}: {exc}"))
            break
        out.append(record)
        if record.error is not None:
            break
        messages.append({"role": "assistant", "content": reply})
        await asyncio.sleep(cfg.think_s)
    return out


async def _quiet_phase(client, cfg: TenantsConfig, phase: str) -> list[QuietTurn]:
    start = time.perf_counter()
    sessions = await asyncio.gather(*(_quiet_session(client, cfg, phase, s) for s in range(cfg.quiet_sessions)))
    records = [turn for session in sessions for turn in session]
    figures = quiet_figures(records)
    progress(
        f"quiet tenant, {phase}: {len(records)} turns in {time.perf_counter() - start:.1f} s, first token p50 "
        f"{figures['ttft_p50_ms']:.0f} ms, cached ratio {figures['cached_ratio']:.3f}, errors {figures['errors']}"
    )
    return records


def progress(line: str) -> None:
    """A line for whoever watches the run: stderr (stdout carries the result alone)."""
    print(f"turncache bench tenants: {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- figures


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def quiet_figures(records: list[QuietTurn]) -> dict:
    """p50 of the client's and the server's first-token times over every turn, and cached / prompt tokens over
    turns 2+ (of turns without an error)."""
    ok = [r for r in records if r.error is None]
    later = [r for r in ok if r.turn > 0]
    return {
        "ttft_p50_ms": _p50([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "server_ttft_p50_ms": _p50([r.server_ttft_ms for r in ok if r.server_ttft_ms is not None]),
        "cached_ratio": sum(r.cached_tokens for r in later) / max(1, sum(r.prompt_tokens for r in later)),
        "errors": len(records) - len(ok),
    }


async def _measure(url: str, cfg: TenantsConfig, texts: list[list[str]], reload_keys) -> dict:
    """Every phase against the server at ``url``; ``reload_keys()`` takes A's priority out of the keys in force."""
    import httpx

    from chat.models.kv_rows import ROW_ALIGN

    limits = httpx.Limits(max_connections=cfg.quiet_sessions + 4)
    plan = NoisyPlan(url, texts, cfg.noisy_conversations, cfg.noisy_reply_tokens, ROW_ALIGN)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        warm = await client.post(  # first-call costs, before anything is measured
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers=_headers(QUIET_KEY),
        )
        warm_errors = int(warm.status_code != 200)
        alone = await _quiet_phase(client, cfg, "alone")

        noisy_start = time.perf_counter()
        async with NoisyChild(plan) as noisy:  # B's workers, in a process of their own
            await noisy.wait_for_turns(min(cfg.noisy_concurrent_turns, cfg.noisy_conversations))  # steady state
            progress(f"noisy tenant in steady state after {time.perf_counter() - noisy_start:.1f} s")
            loaded = await _quiet_phase(client, cfg, "loaded")
            unprioritized = None
            if cfg.quiet_priority:
                reload_keys()
                unprioritized = await _quiet_phase(client, cfg, "loaded-no-priority")
            tally = await noisy.stop()
        noisy_wall = time.perf_counter() - noisy_start
        progress(f"noisy tenant: {tally.turns} turns, {tally.rate_limited} refused with 429, {tally.errors} errors")
    return {
        "alone": alone,
        "loaded": loaded,
        "unprioritized": unprioritized,
        "noisy": tally,
        "noisy_wall_s": noisy_wall,
        "warm_errors": warm_errors,
    }


# ---------------------------------------------------------------- the run


def run(model: str = "smollm2", cfg: TenantsConfig | None = None) -> dict:
    """The benchmark on ``model`` (see the module docstring)."""
    from chat.models import load_model

    leave_parallelism_to_engines()  # torch runs in parallel in the engine's worker only (chat.tools.bench.threads)
    return run_on(in_fresh_thread(lambda: load_model(model)), cfg or TenantsConfig())


def run_on(runtime, cfg: TenantsConfig) -> dict:
    """The benchmark on an already loaded runtime."""
    leave_parallelism_to_engines()
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    start = time.perf_counter()
    per_token = in_fresh_thread(lambda: state_bytes_per_token(runtime))
    texts = noisy_messages(runtime, cfg)
    planned = sum(held_rows(planned_tokens(runtime, noisy_system(0), m, cfg.noisy_reply_tokens)) for m in texts)
    quiet = sum(
        held_rows(
            planned_tokens(
                runtime, quiet_system("alone", s), quiet_questions(s, cfg.quiet_turns), cfg.quiet_reply_tokens
            )
        )
        for s in range(cfg.quiet_sessions)
    )
    budget = int(planned * per_token / cfg.cache_fills)
    progress(
        f"device cache budget {budget / MiB:.1f} MiB ({per_token:.0f} bytes per token): the noisy tenant's "
        f"{cfg.noisy_conversations} conversations hold at least {planned * per_token / MiB:.1f} MiB, the quiet "
        f"sessions {quiet * per_token / MiB:.1f} MiB"
    )
    if cfg.tenant_share is not None and quiet * per_token > cfg.tenant_share * budget:
        progress(
            f"the quiet sessions need {quiet * per_token / MiB:.2f} MiB, more than their share of the "
            f"{budget / MiB:.2f} MiB cache budget: they will lose their own entries (make the noisy workload larger)"
        )
    with tempfile.TemporaryDirectory(prefix="turncache-tenants-") as workdir:
        keys = Path(workdir) / "keys.json"
        keys_file(keys, cfg, priority=True)
        settings = ServerSettings(
            api_keys_file=str(keys),
            tenant_cache_share=cfg.tenant_share,
            keys_poll_s=0,
            host_cache_mib=0,
            cache_dir=None,
            sessions_db=None,
        )
        cache = PrefixCache(device_budget_bytes=budget, host_budget_bytes=0, tenant_share=cfg.tenant_share)
        batch = batch_settings(cfg)
        engine = Engine(runtime, cache=cache, batch=batch, threads=cfg.threads or engine_threads())
        try:
            app = create_app(engine, settings, model_name=runtime.name)

            def without_priority() -> None:
                keys_file(keys, cfg, priority=False)
                if not app.state.keys.reload():
                    raise RuntimeError("the keys file without A's priority was not taken")

            with BackgroundServer(app) as server:
                phases = asyncio.run(_measure(server.url, cfg, texts, without_priority))
            stats = cache.stats()
        finally:
            engine.close()
    return summarize(runtime, cfg, phases, stats, per_token, (planned, quiet), budget) | {
        "date": date,
        "wall_s": time.perf_counter() - start,
    }


def batch_settings(cfg: TenantsConfig):
    """The server's scheduler settings: its defaults, but for those ``cfg`` gives."""
    from chat.engine.scheduler import BatchSettings

    given = {"token_budget": cfg.token_budget, "yield_budget": cfg.yield_budget, "yield_hold_s": cfg.yield_hold_s}
    return BatchSettings(**{k: v for k, v in given.items() if v is not None})


def summarize(runtime, cfg: TenantsConfig, phases: dict, stats, per_token: float, planned: tuple, budget: int) -> dict:
    """The benchmark's keys from what each phase measured and the cache's statistics at the end; ``planned``: the
    K/V rows B's first conversations and A's sessions of one phase hold, as planned."""
    from chat.server.tenancy.auth import cache_salt

    alone, loaded = quiet_figures(phases["alone"]), quiet_figures(phases["loaded"])
    noisy: NoisyTally = phases["noisy"]
    wall = phases["noisy_wall_s"]
    held = stats.bytes_per_tenant
    batch = batch_settings(cfg)
    result = {
        "quiet_ttft_p50_ratio": loaded["ttft_p50_ms"] / alone["ttft_p50_ms"],
        "quiet_cached_ratio": loaded["cached_ratio"],
        "noisy_tokens_per_s": noisy.completion_tokens / wall,
        "rate_limited": noisy.rate_limited,
        "errors": alone["errors"] + loaded["errors"] + noisy.errors + phases["warm_errors"],
        "quiet_ttft_p50_ms_alone": alone["ttft_p50_ms"],
        "quiet_ttft_p50_ms_loaded": loaded["ttft_p50_ms"],
        "quiet_cached_ratio_alone": alone["cached_ratio"],
    }
    if phases["unprioritized"] is not None:
        bare = quiet_figures(phases["unprioritized"])
        result |= {
            "quiet_ttft_p50_ms_loaded_no_priority": bare["ttft_p50_ms"],
            "quiet_ttft_p50_ratio_no_priority": bare["ttft_p50_ms"] / alone["ttft_p50_ms"],
            "quiet_cached_ratio_no_priority": bare["cached_ratio"],
        }
        result["errors"] += bare["errors"]
    result |= {
        "quiet_server_ttft_p50_ms_alone": alone["server_ttft_p50_ms"],
        "quiet_server_ttft_p50_ms_loaded": loaded["server_ttft_p50_ms"],
        "noisy_turns_done": noisy.turns,
        "noisy_conversations_done": noisy.conversations,
        "noisy_prompt_tokens_per_s": noisy.prompt_tokens / wall,
        "noisy_wall_s": wall,
        "noisy_cache_fills": noisy.kv_rows * per_token / budget,
        "noisy_cache_fills_planned": planned[0] * per_token / budget,
        "quiet_cache_mib_planned": planned[1] * per_token / MiB,
        "cache_budget_mib": budget / MiB,
        "state_bytes_per_token": per_token,
        "cache_bytes_quiet_mib": held.get(cache_salt("quiet"), {}).get("device", 0) / MiB,
        "cache_bytes_noisy_mib": held.get(cache_salt("noisy"), {}).get("device", 0) / MiB,
        "cache_evictions": stats.evictions,
        "error_samples": noisy.error_samples
        + [r.error for p in QUIET_PHASES if phases[p] for r in phases[p] if r.error],
        "model": runtime.name,
        "cpu": cpu_model(),
        "retry_after": "honoured",
        **{key: value for key, value in asdict(cfg).items() if key != "seed"},
        "token_budget": batch.token_budget,
        "yield_budget": batch.yield_budget,
        "yield_hold_s": batch.yield_hold_s,
        "threads": cfg.threads or engine_threads(),
    }
    return result


TARGETS = {"quiet_ttft_p50_ratio": ("<=", 1.5), "quiet_cached_ratio": (">=", 0.9), "errors": ("==", 0)}


def main(
    as_json: bool,
    model: str = "smollm2",
    quiet_turns: int | None = None,
    noisy_conversations: int | None = None,
    quiet_priority: int | None = None,
    token_budget: int | None = None,
    yield_budget: int | None = None,
    yield_hold_s: float | None = None,
    threads: int | None = None,
) -> int:
    given = {
        "quiet_turns": quiet_turns,
        "noisy_conversations": noisy_conversations,
        "quiet_priority": quiet_priority,
        "token_budget": token_budget,
        "yield_budget": yield_budget,
        "yield_hold_s": yield_hold_s,
        "threads": threads,
    }
    try:
        cfg = TenantsConfig(**{k: v for k, v in given.items() if v is not None})
    except TenantsSettingError as exc:
        raise SystemExit(f"turncache: --{FLAGS.get(exc.name, exc.name).replace('_', '-')}: {exc}") from exc
    emit(run(model, cfg), TARGETS, as_json)
    return 0


FLAGS = {"quiet_turns": "turns", "noisy_conversations": "conversations"}  # settings whose flag has another name
