"""Anthropic's surface: ``POST /v1/messages`` (``?beta=true`` accepted) and ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from fastapi import FastAPI, Request

from chat.server.reply.adapters import prepared_under
from chat.server.reply.turns import require_chat
from chat.server.routes.parts import ServerParts
from chat.server.surfaces import anthropic_api, anthropic_convert, anthropic_types
from chat.server.tenancy.auth import Tenant


def register(app: FastAPI, parts: ServerParts) -> None:
    engine, admission, stream_response = parts.engine, parts.admission, parts.stream
    check_model, max_pending = admission.check_model, parts.settings.stream_buffer_events

    @app.post("/v1/messages")
    async def messages(body: anthropic_types.MessagesRequest, request: Request):
        """Anthropic's Messages API (``?beta=true`` accepted: the query is not read)."""
        adapter = check_model(body.model)
        require_chat(engine.runtime)
        anthropic_convert.check(body)
        tenant: Tenant = request.state.tenant
        runtime = engine.runtime
        converted = anthropic_convert.to_chat(body, runtime)
        prepared = anthropic_convert.prepare(converted, tenant.salt, runtime)
        volatile = getattr(engine, "volatile", None)  # measured on the prompt the engine renders
        breakpoints = await asyncio.to_thread(
            anthropic_convert.breakpoint_tokens, converted, prepared.turns[0], tenant.salt, runtime, volatile
        )
        prepared = replace(prepared, turns=anthropic_convert.with_breakpoints(prepared.turns, breakpoints))
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        reply = anthropic_api.Reply(body.model, converted, breakpoints, runtime, tuple(body.stop_sequences or ()))
        if body.stream:
            return stream_response(await anthropic_api.stream(tenant_engine, prepared, reply, max_pending=max_pending))
        return await anthropic_api.complete(tenant_engine, prepared, reply)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: anthropic_types.CountTokensRequest, request: Request) -> dict:
        check_model(body.model)
        require_chat(engine.runtime)
        anthropic_convert.check(body)
        tenant: Tenant = request.state.tenant
        volatile = getattr(engine, "volatile", None)
        return await asyncio.to_thread(anthropic_convert.count_tokens, body, tenant.salt, engine.runtime, volatile)
