"""Prometheus text (``chat/server/metrics_text.py``): the engine's counters and its time-to-first-token histogram, the
prefix cache's series (the disk tier's only with one), each tenant's figures and pins labelled by tenant id, and the
sessions database's writer. (Served by ``/metrics``: tests/chat/server/routes/test_ops.py.)"""

from __future__ import annotations

import re
from dataclasses import replace

from cache import PrefixCache
from chat.engine.metrics import Metrics
from chat.server.metrics_text import (
    render_metrics,
    render_session_metrics,
    render_tenant_metrics,
    tenant_pins,
)
from chat.server.persistence.session_rows import Work
from chat.server.persistence.session_writer import WriteStats
from chat.server.tenancy.tenant_gate import TenantFigures


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample; every sample's family has its HELP and TYPE lines before it."""
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    out = {}
    for name, value in re.findall(r"^([^#\s]\S*) (\S+)$", text, re.M):
        family = re.sub(r"(_bucket|_sum|_count)?(\{.*)?$", "", name)
        assert family in declared or re.sub(r"\{.*$", "", name) in declared, name
        out[name] = float(value)
    return out


def test_the_engines_counters_and_a_cumulative_ttft_histogram():
    m = Metrics(turns=3, active=1, prompt_tokens=40, cached_tokens=10, finish_reasons={"stop": 2, "length": 1})
    m.ttft_buckets[0], m.ttft_buckets[2], m.ttft_buckets[-1], m.ttft_sum_s = 1, 1, 1, 40.125
    found = samples(render_metrics(m, None))
    assert found["turncache_turns_total"] == 3 and found["turncache_turns_active"] == 1
    assert found["turncache_cache_hit_ratio"] == 0.25
    assert found['turncache_finished_turns_total{reason="length"}'] == 1
    assert found['turncache_ttft_seconds_bucket{le="0.025"}'] == 1
    assert found['turncache_ttft_seconds_bucket{le="0.05"}'] == 1  # cumulative
    assert found['turncache_ttft_seconds_bucket{le="0.1"}'] == 2
    assert found['turncache_ttft_seconds_bucket{le="+Inf"}'] == 3 and found["turncache_ttft_seconds_count"] == 3
    assert found["turncache_ttft_seconds_sum"] == 40.125
    assert not any(name.startswith("turncache_cache_") and "hit_ratio" not in name for name in found)  # no cache


def test_the_cache_series_and_the_disk_tiers_only_with_one(tmp_path):
    stats = PrefixCache().stats()
    found = samples(render_metrics(Metrics(), stats))
    assert (
        found['turncache_cache_bytes{tier="device"}'] == 0 and found['turncache_cache_pins_total{outcome="made"}'] == 0
    )
    assert "turncache_cache_disk_healthy" not in found
    on_disk = samples(render_metrics(Metrics(), replace(stats, disk_healthy=False, disk_write_errors=2)))
    assert on_disk["turncache_cache_disk_healthy"] == 0 and on_disk["turncache_cache_disk_write_errors_total"] == 2


def test_each_tenants_figures_active_turns_and_pins_labelled_by_tenant():
    figures = {"bob": TenantFigures(turns=2, completion_tokens=7, rate_limited=1)}
    pins = {"bob": {"pins": 3, "bytes": 100}}
    found = samples(render_tenant_metrics(figures, {"alice": 1}, pins))
    assert found['turncache_tenant_turns_total{tenant="bob"}'] == 2
    assert found['turncache_tenant_turns_total{tenant="alice"}'] == 0  # active only: its figures are zero
    assert found['turncache_tenant_turns_active{tenant="alice"}'] == 1
    assert found['turncache_tenant_turns_active{tenant="bob"}'] == 0
    assert found['turncache_tenant_rate_limited_total{tenant="bob"}'] == 1
    assert (
        found['turncache_tenant_pins{tenant="bob"}'] == 3
        and found['turncache_tenant_pinned_entries{tenant="bob"}'] == 0
    )
    assert found['turncache_tenant_pins{tenant="alice"}'] == 0
    text = render_tenant_metrics(figures, {}, None)  # no prefix cache: no pin series
    assert "turncache_tenant_pins" not in text and 'turncache_tenant_turns_total{tenant="bob"} 2' in text


def test_tenant_pins_are_found_by_each_tenants_cache_salt():
    stats = replace(PrefixCache().stats(), pinned_per_tenant={"salt-a": {"pins": 2}})
    assert tenant_pins(stats, {"alice": "salt-a", "bob": "salt-b"}) == {"alice": {"pins": 2}}
    assert tenant_pins(None, {"alice": "salt-a"}) is None


def test_the_session_writers_totals_and_backlog():
    found = samples(render_session_metrics(WriteStats(Work(rows=5, bytes=300), failures=1), pending=4))
    assert found == {
        "turncache_session_rows_written_total": 5,
        "turncache_session_bytes_written_total": 300,
        "turncache_session_write_failures_total": 1,
        "turncache_session_writes_pending": 4,
    }
