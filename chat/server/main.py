"""`turncache serve`: load the model, build the cache and the engine, serve on one port."""

from __future__ import annotations

import logging
import signal
import sys

import uvicorn

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.engine.scheduler import BatchSettings
from chat.engine.volatile_lines import VolatileLines
from chat.models.specs import parse_kv_dtype, parse_weights
from chat.server.app import create_app, key_store
from chat.server.settings import MiB, ServerSettings
from chat.server.transport.backpressure import uvicorn_http_options

log = logging.getLogger("turncache.server")
SHUTDOWN_FLUSH_S = 10.0  # at most this long to write the prefix cache's queued files at a clean shutdown


def build_engine(settings: ServerSettings) -> Engine:
    """The engine, its model loaded inside the engine's worker thread, which alone runs torch with
    ``settings.threads`` threads (see chat.engine.engine: two threads with OpenMP pools of their own slow every step
    down 3x), and its ``--lora`` adapters with it. Raises chat.models' typed errors (unknown model, unsupported
    architecture, bad dtype, an adapter that cannot be loaded or a model that takes none)."""
    from chat.models import load_model
    from chat.server.surfaces.lora_api import load_adapters

    def load():
        runtime = load_model(
            settings.model, settings.dtype, settings.weights, settings.kv_dtype, chat_template=settings.chat_template
        )
        load_adapters(runtime, settings.lora, settings.max_loras)  # --lora NAME=PATH[:SCALE], --max-loras
        return runtime

    return Engine.load(
        load,
        cache=build_cache(settings),
        batch=batch_settings(settings),
        threads=settings.threads,
        volatile=volatile_lines(settings),
    )


def volatile_lines(settings: ServerSettings) -> VolatileLines:
    """The volatile line patterns (``--volatile-line``), dropped unless ``--keep-volatile-lines``."""
    return VolatileLines(settings.volatile_lines, drop=not settings.keep_volatile_lines)


def batch_settings(settings: ServerSettings) -> BatchSettings:
    """What one step of the engine may hold (``--max-batch``, ``--token-budget``, ``--yield-budget``,
    ``--yield-hold-s``)."""
    return BatchSettings(
        settings.max_batch,
        settings.token_budget,
        yield_budget=settings.yield_budget,
        yield_hold_s=settings.yield_hold_s,
    )


def build_cache(settings: ServerSettings) -> PrefixCache | None:
    """The prefix cache the settings ask for: budgets, disk tier, tenant shares; None with --no-prefix-cache."""
    if not settings.prefix_cache:
        return None
    return PrefixCache(
        device_budget_bytes=settings.device_cache_mib * MiB,
        host_budget_bytes=settings.host_cache_mib * MiB,
        disk_dir=settings.cache_dir or None,
        disk_budget_bytes=settings.disk_budget if settings.cache_dir else 0,
        tenant_share=settings.tenant_cache_share,
    )


def close_engine(engine: Engine) -> None:
    """Stop the engine, then write what the prefix cache still has queued (at most SHUTDOWN_FLUSH_S seconds)."""
    engine.close()
    if engine.cache is not None and engine.cache.stats().disk_healthy is not None:
        written = engine.cache.close(timeout=SHUTDOWN_FLUSH_S)
        log.info("prefix cache: disk tier %s at shutdown", "flushed" if written else "NOT fully flushed")


def _exit_cleanly(signum: int, frame: object) -> None:
    """uvicorn re-raises SIGTERM once its graceful shutdown is done: end with status 0 through ``serve``'s finally
    (the default action would kill the process before the engine and the cache are closed)."""
    raise SystemExit(0)


def serve(settings: ServerSettings) -> int:
    import torch

    torch.set_num_threads(1)  # this thread serves HTTP: the engine's worker alone runs torch in parallel
    signal.signal(signal.SIGTERM, _exit_cleanly)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keys = key_store(settings)  # a malformed keys file is refused before the model loads
    from chat.models.chat_template import read_template

    if settings.chat_template is not None:
        read_template(settings.chat_template)  # a template that does not compile is refused before the model loads

    weights = parse_weights(settings.weights, settings.dtype, settings.model)  # the model's default when not given
    kv_dtype = parse_kv_dtype(settings.kv_dtype, settings.dtype, weights)
    print(
        f"turncache: loading {settings.model} ({settings.dtype}, {weights} weights, {kv_dtype} K/V) ...",
        file=sys.stderr,
        flush=True,
    )
    engine = build_engine(settings)
    app = create_app(engine, settings, model_name=engine.runtime.name, keys=keys)
    print(f"turncache: serving {engine.runtime.name} on http://{settings.host}:{settings.port}/", flush=True)
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            access_log=False,  # never printed at "warning"; off, it costs no work per response either
            ws="websockets-sansio",
            ws_max_size=settings.max_ws_frame_mib * MiB,
            **uvicorn_http_options(settings.idle_connection_s, settings.send_buffer_kib),
        )
    finally:
        close_engine(engine)
        app.state.sessions.close()  # writes what is pending
    return 0
