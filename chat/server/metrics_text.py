"""Prometheus text exposition of the engine's metrics and the cache's state."""

from __future__ import annotations

from cache import CacheStats
from chat.engine.metrics import TTFT_BUCKETS_S, Metrics
from chat.server.session_writer import WriteStats


def render_metrics(m: Metrics, cache: CacheStats | None) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value}")

    with m._lock:
        metric("turncache_turns_total", "counter", "Turns finished.", [("", m.turns)])
        metric("turncache_turns_active", "gauge", "Turns in progress.", [("", m.active)])
        metric("turncache_prompt_tokens_total", "counter", "Prompt tokens of finished turns.", [("", m.prompt_tokens)])
        metric(
            "turncache_cached_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            [("", m.cached_tokens)],
        )
        metric("turncache_completion_tokens_total", "counter", "Tokens generated.", [("", m.completion_tokens)])
        metric(
            "turncache_cache_hit_ratio",
            "gauge",
            "Cached / prompt tokens over finished turns.",
            [("", round(m.hit_rate, 6))],
        )
        metric(
            "turncache_finished_turns_total",
            "counter",
            "Finished turns by finish reason.",
            [(f'{{reason="{r}"}}', n) for r, n in sorted(m.finish_reasons.items())],
        )
        metric("turncache_steps_total", "counter", "Batched forwards run by the scheduler.", [("", m.steps)])
        metric("turncache_step_turns_total", "counter", "Turns fed, summed over steps.", [("", m.step_turns)])
        metric("turncache_step_tokens_total", "counter", "Tokens fed, summed over steps.", [("", m.step_tokens)])
        cumulative, buckets = 0, []
        for bound, count in zip((*TTFT_BUCKETS_S, float("inf")), m.ttft_buckets, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            buckets.append((f'_bucket{{le="{le}"}}', cumulative))
        lines.append("# HELP turncache_ttft_seconds Time to first token.")
        lines.append("# TYPE turncache_ttft_seconds histogram")
        for suffix, value in buckets:
            lines.append(f"turncache_ttft_seconds{suffix} {value}")
        lines.append(f"turncache_ttft_seconds_sum {round(m.ttft_sum_s, 6)}")
        lines.append(f"turncache_ttft_seconds_count {cumulative}")
    if cache is not None:
        metric(
            "turncache_cache_entries",
            "gauge",
            "Prefix cache entries per tier.",
            [(f'{{tier="{t}"}}', n) for t, n in cache.entries_per_tier.items()],
        )
        metric(
            "turncache_cache_bytes",
            "gauge",
            "Prefix cache bytes per tier.",
            [(f'{{tier="{t}"}}', n) for t, n in cache.bytes_per_tier.items()],
        )
        metric("turncache_cache_evictions_total", "counter", "Entries dropped for budget.", [("", cache.evictions)])
        metric("turncache_cache_offloads_total", "counter", "Entries moved device -> host.", [("", cache.offloads)])
        metric(
            "turncache_cache_superseded_total",
            "counter",
            "Entries replaced by their own extension.",
            [("", cache.superseded)],
        )
        metric("turncache_cache_lookups_total", "counter", "Prefix lookups.", [("", cache.lookups)])
        metric("turncache_cache_hits_total", "counter", "Prefix lookups that hit.", [("", cache.hits)])
    return "\n".join(lines) + "\n"


def render_session_metrics(stats: WriteStats, pending: int) -> str:
    """The sessions database's writer: what it wrote, what failed (the sessions then stay in memory), the backlog."""
    samples = [
        ("turncache_session_rows_written_total", "counter", "Rows written to the sessions database.", stats.work.rows),
        ("turncache_session_bytes_written_total", "counter", "Bytes of those rows.", stats.work.bytes),
        (
            "turncache_session_write_failures_total",
            "counter",
            "Batches of session writes that failed (disk full, read-only, ...); those sessions stay in memory.",
            stats.failures,
        ),
        ("turncache_session_writes_pending", "gauge", "Session writes queued, not yet on disk.", pending),
    ]
    lines = []
    for name, kind, help_text, value in samples:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return "\n".join(lines) + "\n"
