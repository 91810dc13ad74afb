"""``POST /tokenize`` and ``POST /detokenize`` (as vLLM's)."""

from __future__ import annotations

from fastapi import FastAPI

from chat.server.routes.parts import ServerParts
from chat.server.surfaces import tokenize_api


def register(app: FastAPI, parts: ServerParts) -> None:
    engine, check_model = parts.engine, parts.admission.check_model

    @app.post("/tokenize")
    async def tokenize(body: tokenize_api.TokenizeRequest) -> dict:
        check_model(body.model)
        return tokenize_api.tokenize(body, engine.runtime)

    @app.post("/detokenize")
    async def detokenize(body: tokenize_api.DetokenizeRequest) -> dict:
        check_model(body.model)
        return tokenize_api.detokenize(body, engine.runtime)
