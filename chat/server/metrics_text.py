"""Prometheus text exposition of the engine's metrics, the cache's state and each tenant's figures."""

from __future__ import annotations

from collections.abc import Mapping

from cache import CacheStats
from chat.engine.metrics import TTFT_BUCKETS_S, Metrics
from chat.server.persistence.session_writer import WriteStats
from chat.server.tenancy.tenant_gate import TenantFigures

TENANT_SERIES = (  # (name, kind, help, TenantFigures field; None: turns running now)
    ("turncache_tenant_turns_total", "counter", "Turns ended, per tenant.", "turns"),
    ("turncache_tenant_turns_active", "gauge", "Turns running, per tenant.", None),
    ("turncache_tenant_prompt_tokens_total", "counter", "Prompt tokens of ended turns, per tenant.", "prompt_tokens"),
    ("turncache_tenant_cached_tokens_total", "counter", "Of those, served from the prefix cache.", "cached_tokens"),
    ("turncache_tenant_completion_tokens_total", "counter", "Tokens generated, per tenant.", "completion_tokens"),
    ("turncache_tenant_rate_limited_total", "counter", "Requests refused for a limit, per tenant.", "rate_limited"),
)
TENANT_PIN_SERIES = (  # (name, kind, help, key of CacheStats.pinned_per_tenant's values)
    ("turncache_tenant_pins", "gauge", "Live pins (prompt-caching breakpoints held), per tenant.", "pins"),
    ("turncache_tenant_pinned_entries", "gauge", "Cache entries holding its pins, per tenant.", "entries"),
    ("turncache_tenant_pinned_bytes", "gauge", "Bytes of those entries (device tier), per tenant.", "bytes"),
    ("turncache_tenant_pins_refused_total", "counter", "Pins refused (not cached, or over its share).", "refused"),
    ("turncache_tenant_pins_expired_total", "counter", "Pins whose TTL passed after their last use.", "expired"),
)


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
        metric(
            "turncache_steps_interrupted_total",
            "counter",
            "Forwards stopped between layers for a turn of better priority (their work is done again).",
            [("", m.steps_interrupted)],
        )
        metric(
            "turncache_turn_pauses_total",
            "counter",
            "Times a turn was paused (kept out of the steps) because its client fell behind reading its stream.",
            [("", m.turn_pauses)],
        )
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
        metric("turncache_cache_pins", "gauge", "Live pins (prompt-caching breakpoints held).", [("", cache.pins)])
        metric(
            "turncache_cache_pinned_entries",
            "gauge",
            "Entries holding pins (kept on the device tier).",
            [("", cache.pinned_entries)],
        )
        metric("turncache_cache_pinned_bytes", "gauge", "Bytes of those entries.", [("", cache.pinned_bytes)])
        metric(
            "turncache_cache_pins_total",
            "counter",
            "Pin requests by outcome (made, renewed, refused), and pins expired.",
            [
                ('{outcome="made"}', cache.pins_made),
                ('{outcome="renewed"}', cache.pins_renewed),
                ('{outcome="refused"}', cache.pins_refused),
                ('{outcome="expired"}', cache.pins_expired),
            ],
        )
        if cache.disk_healthy is not None:
            _disk_metrics(metric, cache)
    return "\n".join(lines) + "\n"


def render_tenant_metrics(
    figures: dict[str, TenantFigures],
    active: dict[str, int],
    pins: Mapping[str, Mapping[str, int]] | None = None,
) -> str:
    """Each tenant's figures, labelled ``tenant="ID"`` (tenant ids need no escaping: ``[A-Za-z0-9._-]``); the caller
    chooses whose (an admin key: every tenant's; any other key: its own). ``pins``: tenant id -> its pins' figures
    (:func:`tenant_pins`), None without a prefix cache."""
    lines: list[str] = []
    tenants = sorted(set(figures) | set(active))
    for name, kind, help_text, attribute in TENANT_SERIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for tenant in tenants:
            found = figures.get(tenant, TenantFigures())
            value = active.get(tenant, 0) if attribute is None else getattr(found, attribute)
            lines.append(f'{name}{{tenant="{tenant}"}} {value}')
    if pins is not None:
        for name, kind, help_text, key in TENANT_PIN_SERIES:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{tenant="{t}"}} {pins.get(t, {}).get(key, 0)}' for t in tenants]
    return "\n".join(lines) + "\n"


def tenant_pins(cache: CacheStats | None, salts: Mapping[str, str]) -> dict[str, Mapping[str, int]] | None:
    """Tenant id -> its pins' figures (``CacheStats.pinned_per_tenant`` by cache salt), for the tenants in ``salts``
    (tenant id -> cache salt); None without a prefix cache."""
    if cache is None:
        return None
    return {tenant: cache.pinned_per_tenant[salt] for tenant, salt in salts.items() if salt in cache.pinned_per_tenant}


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


def _disk_metrics(metric, cache: CacheStats) -> None:
    metric(
        "turncache_cache_disk_healthy",
        "gauge",
        "1 while the disk tier writes; 0 after a failed write (full or read-only disk) or an unusable directory.",
        [("", int(bool(cache.disk_healthy)))],
    )
    metric(
        "turncache_cache_disk_pending_writes",
        "gauge",
        "Entry files queued or being written.",
        [("", cache.disk_pending)],
    )
    metric("turncache_cache_disk_writes_total", "counter", "Entry files written.", [("", cache.disk_writes)])
    metric(
        "turncache_cache_disk_write_errors_total",
        "counter",
        "Entry files that could not be written.",
        [("", cache.disk_write_errors)],
    )
    metric("turncache_cache_disk_reads_total", "counter", "Entries read back from disk.", [("", cache.disk_reads)])
    metric(
        "turncache_cache_disk_read_errors_total",
        "counter",
        "Entries dropped because their files were missing, corrupt or foreign.",
        [("", cache.disk_read_errors)],
    )
    metric(
        "turncache_cache_disk_skipped_files",
        "gauge",
        "Files skipped at startup (unreadable, truncated, foreign, renamed).",
        [("", cache.disk_skipped_files)],
    )
    metric(
        "turncache_cache_spills_total", "counter", "Entries that left memory for the disk tier.", [("", cache.spills)]
    )
