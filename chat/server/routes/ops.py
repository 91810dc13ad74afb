"""``GET /health``, ``GET /metrics`` (Prometheus text) and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from chat.server.metrics_text import render_metrics, render_session_metrics, render_tenant_metrics
from chat.server.persistence.session_db import SqliteSessionStore
from chat.server.routes.parts import ServerParts
from chat.server.tenancy.auth import Tenant


def register(app: FastAPI, parts: ServerParts) -> None:
    engine, gate, keys, store, model_name = parts.engine, parts.gate, parts.keys, parts.sessions, parts.model_name

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "active_turns": engine.active_turns()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> str:
        """An admin key (``--auth-token``'s, one flagged in the keys file, anyone on an open server): the server's
        metrics and every tenant's figures; any other key: its own tenant's figures only."""
        tenant: Tenant = request.state.tenant
        if not tenant.admin:
            own = {tenant.id: gate.figures_of(tenant.id)}
            return render_tenant_metrics(own, {tenant.id: gate.active(tenant.id)})
        text = render_metrics(engine.metrics, engine.cache_stats())
        if isinstance(store, SqliteSessionStore):
            text += render_session_metrics(store.writer.stats, store.writer.pending)
        tenants = set(gate.figures) | set(keys.ring.tenants())
        figures = {t: gate.figures_of(t) for t in tenants}
        return text + render_tenant_metrics(figures, {t: gate.active(t) for t in tenants})

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "local"}]}
