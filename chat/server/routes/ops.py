"""``GET /health``, ``GET /metrics`` (Prometheus text) and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from chat.server.metrics_text import render_metrics, render_session_metrics, render_tenant_metrics, tenant_pins
from chat.server.persistence.session_backends import DurableSessionStore
from chat.server.reply.turns import chats
from chat.server.routes.parts import ServerParts
from chat.server.tenancy.auth import Tenant, cache_salt


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
        stats = engine.cache_stats()
        if not tenant.admin:
            own = {tenant.id: gate.figures_of(tenant.id)}
            pins = tenant_pins(stats, {tenant.id: tenant.salt})
            return render_tenant_metrics(own, {tenant.id: gate.active(tenant.id)}, pins)
        text = render_metrics(engine.metrics, stats)
        if isinstance(store, DurableSessionStore):
            text += render_session_metrics(*store.write_stats())
        tenants = set(gate.figures) | set(keys.ring.tenants())
        figures = {t: gate.figures_of(t) for t in tenants}
        pins = tenant_pins(stats, {t: cache_salt(t) for t in tenants})
        return text + render_tenant_metrics(figures, {t: gate.active(t) for t in tenants}, pins)

    @app.get("/v1/models")
    async def models() -> dict:
        listed = {"id": model_name, "object": "model", "created": 0, "owned_by": "local"}
        # extension: whether the model has a chat template (false: a base model, completions only)
        chat = chats(engine.runtime)
        cards = ({**card, "chat": chat} for card in parts.adapters.cards())  # each with its parent (the model)
        return {"object": "list", "data": [{**listed, "chat": chat}, *cards]}
