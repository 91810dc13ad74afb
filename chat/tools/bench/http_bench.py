"""`turncache bench http`: what the server keeps of the engine's throughput, one run.

The workload is ``bench batch``'s (:mod:`chat.tools.bench.batch_bench`): at each level of concurrent sessions, every
session asks one different question at the same moment, greedy, replies of ``reply_tokens`` (64) tokens. Each level
runs three ways, each on a fresh engine with an empty prefix cache (the same prompts would hit otherwise):

- ``engine``: the turns submitted to the engine directly (``bench batch``'s measurement);
- ``http``: ``POST /v1/chat/completions`` with ``stream: true`` to a real server on loopback (uvicorn in a thread of
  this process, on the event loop ``turncache serve`` uses), from an asyncio client (aiohttp on uvloop) that reads
  the server-sent events line by line and parses each;
- ``ws``: ``completion.create`` on one WebSocket per session (the ``websockets`` client), every event parsed.

The served ways' clients run in a process of their own (:mod:`chat.tools.bench.http_clients`), as a server's clients run
elsewhere: in this process they would share its interpreter lock with the server and the engine's thread, a cost no
deployment has (two runs side by side did not tell the placements apart, docs/benchmarks.md); what they take of the
machine's cores is reported as ``client_cpu_share``. ``clients_apart=False`` (``--clients-in-process``) runs them in
this process's main thread as before, for comparison.

A level's rate is all completion tokens (the replies' ``usage``) over its wall time, from the first request sent to the
last reply ended; its time to first token is the median over sessions (served: from the request sent to the first
content received, on the client's clock; engine: the engine's own ``ttft_ms``). Each level runs ``rounds`` times
(:data:`DEFAULT_ROUNDS`, 8), each on fresh engines, the three ways back to back within a round, in the order engine,
http, ws in even rounds and reversed in odd ones (so that over an even number of rounds each way's mean position is the
same and a steady drift of the machine lands on no way in particular). Rates and first-token times are medians over the
rounds; a served / engine ratio is the median over the rounds of the ratio within each round (not the ratio of the
medians), so that a round where the whole machine was slow moves both sides of its ratio. Eight rounds, not four: on a
2-vCPU machine one round's own ratio moves by +-15% with the same code (the engine alone, run after run in one process:
519-705 tokens/s at 32 sessions; docs/benchmarks.md, 2026-11-26 night), so the median of four moved by about +-8%, as
much as the targets' margins, and a run's verdict was a draw.

Keys: ``levels``; per level, as lists in the order of ``levels``: ``engine_tokens_per_s``, ``http_tokens_per_s``,
``ws_tokens_per_s``, ``http_ttft_p50_ms``, ``engine_ttft_p50_ms``, ``served_ratio_http`` and ``served_ratio_ws``
(served rate / engine rate, paired by round as above); ``client_cpu_share``: the CPU time of the clients (their
process's, or the thread that runs their event loop with ``--clients-in-process``, over each served run) over the
served runs' wall time x the machine's cores, so 0.5 on 2 cores means the clients took one core to themselves;
``errors``: turns that failed, on any path.

**Bad clients** (:class:`BadClients`): then the workload runs at ``bad_client_level`` sessions (default: the largest
level) over HTTP, ``rounds`` times without and with bad clients beside it (alternating which comes first, the
sessions' clients as above), on servers
with API keys (the sessions, the slow readers and the flood are three tenants; the flood's has a limit of
``flood_requests_per_minute``) and tighter backpressure settings (``bad_client_settings``). The bad clients run in a
process of their own (:mod:`chat.tools.bench.bad_clients`: slow readers that read nothing for ``--bad-pause-s``,
silent connections, a flood of tiny requests); the sessions start once every bad client is in its bad state. Keys:
``bad_client_tokens_per_s_ratio``: the sessions' rate with the bad clients over their rate without (the median over
the rounds of each round's own ratio, as for the served ratios; target >= 0.9), with ``bad_client_clean_tokens_per_s``
and ``bad_client_loaded_tokens_per_s`` (medians of the runs); ``bad_client_outcomes``:
what the bad clients got, summed over the runs (per kind, as :mod:`~chat.tools.bench.bad_clients` counts them:
``slow_client`` / ``cut`` / ``completed`` / ``refused`` / ``unfinished``; ``closed`` / ``open_at_stop`` /
``longest_open_s``; ``requests`` / ``ok`` / ``rate_limited`` / ``other``); ``bad_client_cpu_share``: their process's
CPU time over its wall time x the machine's cores; ``bad_client_rss_growth_mib``: how much more this process's
resident memory grew in a run with the bad clients than without (medians of peak over start); ``bad_client_level``;
``bad_client_turn_pauses``: turns the engines paused because their client fell behind reading, summed over the runs
without (``clean``: the sessions' own, expected 0) and with the bad clients (``loaded``: the slow readers').
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from chat.tools.bench.batch_bench import prompts, run_level
from chat.tools.bench.child_process import child_report, ready_child
from chat.tools.bench.http_clients import ClientConfig, Served, run_apart, run_here
from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

LEVELS = (1, 8, 32)
DEFAULT_ROUNDS = 8  # rounds of each level, and of the bad-client phase (see the module docstring)
BAD_CLIENTS_STOP_S = 120.0  # the longest the bad clients' process may take to stop and report


@dataclass
class Level:
    """One run of one level one way."""

    tokens_per_s: float
    ttft_p50_ms: float
    errors: int
    wall_s: float
    client_cpu_s: float = 0.0  # served runs: the clients' CPU time over wall_s


def served_level(
    engine,
    runtime,
    transport: str,
    conversations: list[list[dict]],
    reply_tokens: int,
    *,
    clients_apart: bool = True,
    settings=None,
    key: str | None = None,
    beside=None,
) -> Level:
    """All conversations at once through a server over ``engine`` (with ``settings``, default the server's), over
    ``transport`` ("http" or "ws", sending ``key``), from clients in a process of their own (``clients_apart``) or in
    this thread (:mod:`chat.tools.bench.http_clients`). ``beside(server)``: a context manager entered once the server
    is up, left once the conversations are done (the bad clients' process)."""
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    app = create_app(engine, settings if settings is not None else ServerSettings(), model_name=runtime.name)
    with BackgroundServer(app) as server, beside(server) if beside is not None else contextlib.nullcontext():
        cfg = ClientConfig(transport, server.url, conversations, reply_tokens, key)
        replies, wall, cpu = (run_apart if clients_apart else run_here)(cfg)
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
    rounds: int = DEFAULT_ROUNDS,
    max_batch: int | None = None,
    token_budget: int | None = None,
    bad: BadClients | None = None,
    clients_apart: bool = True,
) -> dict:
    """The benchmark on a loaded runtime (``bad``: the bad-client phase's set-up, default at the largest level;
    ``clients_apart``: the sessions' clients in a process of their own, else in this thread). Torch runs in parallel
    only in the engines' workers: this thread stays single-threaded (chat.tools.bench.threads)."""
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.scheduler import BatchSettings

    leave_parallelism_to_engines()
    settings = BatchSettings(**{k: v for k, v in (("max_batch", max_batch), ("token_budget", token_budget)) if v})

    def fresh_engine() -> Engine:
        return Engine(runtime, cache=PrefixCache(), batch=settings, threads=engine_threads())

    ways = {
        "engine": lambda e, c: engine_level(e, c, reply_tokens),
        "http": lambda e, c: served_level(e, runtime, "http", c, reply_tokens, clients_apart=clients_apart),
        "ws": lambda e, c: served_level(e, runtime, "ws", c, reply_tokens, clients_apart=clients_apart),
    }
    warm = fresh_engine()
    try:  # every weight touched once, the server's code paths imported
        ways["engine"](warm, prompts(1))
        ways["http"](warm, prompts(1))
    finally:
        warm.close()
    results: dict[str, list[list[Level]]] = {way: [] for way in ways}
    for n in levels:
        runs: dict[str, list[Level]] = {way: [] for way in ways}
        for r in range(rounds):
            for way in round_order(tuple(ways), r):
                engine = fresh_engine()
                try:
                    runs[way].append(ways[way](engine, prompts(n)))
                finally:
                    engine.close()
        for way in ways:
            results[way].append(runs[way])
    result = summary(levels, results)
    phase = bad_client_phase(
        runtime, fresh_engine, bad or BadClients(max(levels)), rounds, reply_tokens, clients_apart=clients_apart
    )
    result["errors"] += phase.pop("errors")
    return {**result, **phase}


# ---------------------------------------------------------------- bad clients


@dataclass(frozen=True)
class BadClients:
    """The bad-client phase: ``level`` sessions of the workload over HTTP, on servers with these settings, run
    without and with the bad clients of :mod:`chat.tools.bench.bad_clients` (a process of their own) beside them.
    The backpressure settings are tighter than the server's defaults (4096 events, 30 s, 30 s, the kernel's send
    buffer, which takes megabytes on loopback) so that they act within a run of seconds; both runs of a round use
    the same."""

    level: int  # sessions of the workload
    pause_s: float = 5.0  # a slow reader reads nothing this long after sending its request
    slow_readers: int = 2  # concurrent slow readers (a tenant without limits)
    silent: int = 16  # connections kept open without a byte sent
    flood_rps: float = 100.0  # tiny requests a second (a tenant of its own)
    flood_requests_per_minute: int = 10  # the flood tenant's limit (requests_per_minute in the keys)
    stream_buffer_events: int = 64  # the servers' --stream-buffer-events in this phase
    send_timeout_s: float = 2.0  # their --send-timeout-s
    idle_connection_s: float = 2.0  # their --idle-connection-s
    send_buffer_kib: int = 16  # their --send-buffer-kib

    def server_settings(self, keys: dict):
        from chat.server.settings import ServerSettings

        return ServerSettings(
            api_keys=json.dumps(keys),
            keys_poll_s=0,
            stream_buffer_events=self.stream_buffer_events,
            send_timeout_s=self.send_timeout_s,
            idle_connection_s=self.idle_connection_s,
            send_buffer_kib=self.send_buffer_kib,
        )


@contextlib.contextmanager
def bad_clients_beside(server, phase: BadClients, keys: dict[str, str], reports: list[dict]) -> Iterator[None]:
    """The bad clients' process against ``server``: entered once every bad client is in its bad state, left once
    it has stopped; its report is appended to ``reports``.

    Raises:
        RuntimeError: the process did not start its clients or did not report.
    """
    config = {
        "host": "127.0.0.1",
        "port": server.port,
        "slow_key": keys["slow"],
        "flood_key": keys["flood"],
        "slow_readers": phase.slow_readers,
        "pause_s": phase.pause_s,
        "silent": phase.silent,
        "flood_rps": phase.flood_rps,
    }
    with ready_child("chat.tools.bench.bad_clients", config, "the bad clients") as process:
        yield
        reports.append(child_report(process, "stop\n", BAD_CLIENTS_STOP_S, "the bad clients"))


class PeakRss:
    """The process's resident memory while in the block: ``growth_mib``, its peak over its value on entry (sampled
    every 20 ms from /proc; None where there is no /proc)."""

    def __init__(self) -> None:
        self.growth_mib: float | None = None
        self._stop = threading.Event()
        self._peak = 0
        self._thread = threading.Thread(target=self._sample, name="bench-rss", daemon=True)

    @staticmethod
    def _rss() -> int | None:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self._peak = max(self._peak, self._rss() or 0)

    def __enter__(self) -> PeakRss:
        self._start = self._rss()
        self._peak = self._start or 0
        if self._start is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        self._stop.set()
        self._thread.join()
        self.growth_mib = (max(self._peak, self._rss() or 0) - self._start) / 2**20


Runs = dict[bool, list[tuple[Level, float | None]]]  # with bad clients or not -> each run's level and memory growth


def bad_client_phase(
    runtime, fresh_engine, phase: BadClients, rounds: int, reply_tokens: int, *, clients_apart: bool = True
) -> dict:
    """``rounds`` rounds of the phase (without and with the bad clients, in alternating order); its keys."""
    tenants = ("sessions", "slow", "flood")
    keys = {tenant: secrets.token_urlsafe(24) for tenant in tenants}
    flood_limit = {"requests_per_minute": phase.flood_requests_per_minute}
    spec = {keys[t]: t for t in tenants} | {"tenants": {"flood": flood_limit}}
    settings = phase.server_settings(spec)
    runs: Runs = {False: [], True: []}
    pauses = {False: 0, True: 0}  # turns the engines paused (their client fell behind), without and with bad clients
    reports: list[dict] = []
    for r in range(rounds):
        for loaded in (False, True) if r % 2 == 0 else (True, False):
            beside = (lambda server: bad_clients_beside(server, phase, keys, reports)) if loaded else None
            engine = fresh_engine()
            try:
                with PeakRss() as rss:
                    level = served_level(
                        engine,
                        runtime,
                        "http",
                        prompts(phase.level),
                        reply_tokens,
                        clients_apart=clients_apart,
                        settings=settings,
                        key=keys["sessions"],
                        beside=beside,
                    )
            finally:
                engine.close()
            runs[loaded].append((level, rss.growth_mib))
            pauses[loaded] += engine.metrics.turn_pauses
    return bad_client_summary(phase, runs, reports, pauses)


def bad_client_summary(
    phase: BadClients, runs: Runs, reports: list[dict], pauses: dict[bool, int] | None = None
) -> dict:
    """The phase's keys from its runs (``runs[with bad clients]``: each run's level and memory growth), the bad
    clients' reports and the turns the engines paused (``pauses[with bad clients]``, summed over the runs)."""
    clean, loaded = (statistics.median(level.tokens_per_s for level, _ in runs[k]) for k in (False, True))
    pauses = pauses or {False: 0, True: 0}
    paired = [  # each round's own ratio: its two runs back to back (a drift between rounds falls on neither side)
        with_bad.tokens_per_s / without.tokens_per_s
        for (without, _), (with_bad, _) in zip(runs[False], runs[True], strict=True)
    ]
    growth = [[g for _, g in runs[k] if g is not None] for k in (False, True)]
    outcomes: dict[str, dict] = {}
    for report in reports:
        for kind in ("slow_reader", "silent", "flood"):
            into = outcomes.setdefault(kind, {})
            for name, value in report[kind].items():
                into[name] = max(into.get(name, 0), value) if name == "longest_open_s" else into.get(name, 0) + value
    wall = sum(r["wall_s"] for r in reports)
    return {
        "bad_client_level": phase.level,
        "bad_client_clean_tokens_per_s": clean,
        "bad_client_loaded_tokens_per_s": loaded,
        "bad_client_tokens_per_s_ratio": statistics.median(paired),
        "bad_client_outcomes": outcomes,
        "bad_client_cpu_share": sum(r["cpu_s"] for r in reports) / (wall * (os.cpu_count() or 1)) if wall else 0.0,
        "bad_client_rss_growth_mib": (
            statistics.median(growth[1]) - statistics.median(growth[0]) if all(growth) else None
        ),
        "bad_client_settings": asdict(phase),
        "bad_client_turn_pauses": {"clean": pauses[False], "loaded": pauses[True]},
        "errors": sum(level.errors for k in (False, True) for level, _ in runs[k]),
    }


def round_order(ways: tuple[str, ...], r: int) -> tuple[str, ...]:
    """The order of the ways in round ``r``: as given in even rounds, reversed in odd ones, so that over an even
    number of rounds every way's mean position is the same and a machine that drifts steadily favours none."""
    return ways if r % 2 == 0 else ways[::-1]


def summary(levels: tuple[int, ...], results: dict[str, list[list[Level]]]) -> dict:
    """The result object from every run: ``results[way][level index]`` lists that level's rounds, in the order they
    ran. Rates and first-token times are medians over the rounds; a served / engine ratio is the median over the
    rounds of the ratio within each round (the ways of a round ran back to back)."""

    def median(way: str, field: str) -> list[float]:
        return [statistics.median(getattr(r, field) for r in runs) for runs in results[way]]

    def ratio(way: str) -> list[float]:
        return [
            statistics.median(s.tokens_per_s / e.tokens_per_s for s, e in zip(served, engine, strict=True))
            for served, engine in zip(results[way], results["engine"], strict=True)
        ]

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
        "served_ratio_http": ratio("http"),
        "served_ratio_ws": ratio("ws"),
        "client_cpu_share": sum(r.client_cpu_s for r in served) / (served_wall * (os.cpu_count() or 1)),
        "errors": sum(r.errors for runs in results.values() for level in runs for r in level),
    }


TARGETS = {"errors": ("==", 0), "bad_client_tokens_per_s_ratio": (">=", 0.9)}


def targets_met(result: dict) -> dict[str, bool]:
    """The issue's targets: served / engine >= 0.85 at 8 and 32 sessions, both transports; the other sessions within
    10% of their throughput without the bad clients; no errors."""
    out = {
        "errors == 0": result["errors"] == 0,
        "bad_client_tokens_per_s_ratio >= 0.9": result["bad_client_tokens_per_s_ratio"] >= 0.9,
    }
    for way in ("http", "ws"):
        for level, ratio in zip(result["levels"], result[f"served_ratio_{way}"], strict=True):
            if level >= 8:
                out[f"served_ratio_{way} at {level} >= 0.85"] = ratio >= 0.85
    return out


def main(
    as_json: bool,
    model: str = "smollm2",
    levels: tuple[int, ...] = LEVELS,
    *,
    rounds: int = DEFAULT_ROUNDS,
    bad_level: int | None = None,
    bad_pause_s: float = 5.0,
    clients_apart: bool = True,
    chat_template: str | None = None,
) -> int:
    from chat.models import load_model

    bad = BadClients(bad_level or max(levels), pause_s=bad_pause_s)
    runtime = in_fresh_thread(lambda: load_model(model, chat_template=chat_template))
    result = run_on(runtime, levels=levels, rounds=rounds, bad=bad, clients_apart=clients_apart)
    if not as_json:
        result = {**result, **{f"target: {k}": v for k, v in targets_met(result).items()}}
    emit(result, TARGETS, as_json)
    return 0
