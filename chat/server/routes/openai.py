"""OpenAI's surfaces: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses`` and
``GET`` / ``DELETE /v1/responses/{id}``: check model (the base or a LoRA adapter) -> the surface's turns (under the
adapter) -> admit -> stream or complete."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.reply.adapters import prepared_under
from chat.server.reply.turns import require_chat
from chat.server.routes.parts import ServerParts
from chat.server.surfaces import completions_api, openai_api, responses_api
from chat.server.tenancy.auth import Tenant


def register(app: FastAPI, parts: ServerParts) -> None:
    engine, settings, model_name, admission = parts.engine, parts.settings, parts.model_name, parts.admission
    response_store, check_model, stream_response = parts.responses, admission.check_model, parts.stream
    max_pending = settings.stream_buffer_events

    @app.post("/v1/chat/completions")
    async def chat_completions(body: openai_api.ChatCompletionRequest, request: Request):
        adapter = check_model(body.model)
        require_chat(engine.runtime)
        body.check(settings.max_n)
        tenant: Tenant = request.state.tenant
        prepared = openai_api.prepare(body, tenant.salt, engine.runtime, reply_cap=settings.max_reply_tokens)
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        args = (tenant_engine, prepared.turns, model_name, prepared.plan, prepared.markers)
        if body.stream:
            return stream_response(await openai_api.stream(*args, max_pending=max_pending))
        return await openai_api.complete(*args)

    @app.post("/v1/completions")
    async def completions(body: completions_api.CompletionRequest, request: Request):
        adapter = check_model(body.model)
        body.check(settings.max_n)
        tenant: Tenant = request.state.tenant
        prepared = completions_api.prepare(body, tenant.salt, engine.runtime, reply_cap=settings.max_reply_tokens)
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        if body.stream:
            events = await completions_api.stream(
                tenant_engine, body, prepared.turns, model_name, max_pending=max_pending
            )
            return stream_response(events)
        return await completions_api.complete(tenant_engine, body, prepared.turns, model_name)

    @app.post("/v1/responses")
    async def responses(body: responses_api.ResponsesRequest, request: Request):
        adapter = check_model(body.model)
        require_chat(engine.runtime)
        body.check()
        tenant: Tenant = request.state.tenant
        history: tuple = ()
        if body.previous_response_id is not None:
            prior = response_store.get(body.previous_response_id, tenant.id)
            if prior is None:
                message = f"previous_response_id: no response {body.previous_response_id!r}"
                raise RequestError(ErrorCode.NOT_FOUND, message, param="previous_response_id")
            history = prior.messages
        prepared, conversation = responses_api.prepare(
            body, history, tenant.salt, engine.runtime, reply_cap=settings.max_reply_tokens, max_n=settings.max_n
        )
        prepared = prepared_under(prepared, adapter)
        tenant_engine = await admission.admit(tenant, prepared)
        (turn,) = prepared.turns
        args = (tenant_engine, turn, body, model_name, prepared.plan, prepared.markers, response_store, tenant.id)
        if body.stream:
            return stream_response(await responses_api.stream(*args, conversation, max_pending=max_pending))
        return await responses_api.complete(*args, conversation)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict:
        found = response_store.get(response_id, request.state.tenant.id)
        if found is None:
            raise RequestError(ErrorCode.NOT_FOUND, f"no response {response_id!r}", param="response_id")
        return found.body

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> Response:
        if not response_store.delete(response_id, request.state.tenant.id):
            raise RequestError(ErrorCode.NOT_FOUND, f"no response {response_id!r}", param="response_id")
        return responses_api.deleted(response_id)
