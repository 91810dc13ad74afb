"""`turncache serve`: load the model, build the cache and the engine, serve on one port."""

from __future__ import annotations

import logging
import sys

import uvicorn

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.engine.scheduler import BatchSettings
from chat.server.app import create_app, key_ring
from chat.server.settings import MiB, ServerSettings


def build_engine(settings: ServerSettings) -> Engine:
    """Raises chat.models' typed errors (unknown model, unsupported architecture, bad dtype)."""
    from chat.models import load_model

    runtime = load_model(settings.model, settings.dtype, settings.weights)
    cache = None
    if settings.prefix_cache:
        cache = PrefixCache(
            device_budget_bytes=settings.device_cache_mib * MiB, host_budget_bytes=settings.host_cache_mib * MiB
        )
    return Engine(runtime, cache=cache, batch=BatchSettings(settings.max_batch, settings.token_budget))


def serve(settings: ServerSettings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keys = key_ring(settings)  # a malformed keys file is refused before the model loads
    weights = f", {settings.weights} weights" if settings.weights else ""
    print(f"turncache: loading {settings.model} ({settings.dtype}{weights}) ...", file=sys.stderr, flush=True)
    engine = build_engine(settings)
    app = create_app(engine, settings, model_name=engine.runtime.name, keys=keys)
    print(f"turncache: serving {engine.runtime.name} on http://{settings.host}:{settings.port}/", flush=True)
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            ws="websockets-sansio",
            ws_max_size=settings.max_ws_frame_mib * MiB,
        )
    finally:
        engine.close()
        app.state.sessions.close()  # writes what is pending
    return 0
