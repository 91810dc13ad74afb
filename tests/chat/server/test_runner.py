import asyncio

import httpx
import uvicorn
from fastapi import FastAPI

from chat.server.runner import BackgroundServer


def test_the_background_server_runs_on_the_event_loop_turncache_serve_runs_on():
    # `turncache serve` calls uvicorn.run, which picks its loop (uvloop where installed); tests and benchmarks run
    # the app in a BackgroundServer and must measure that loop, not asyncio's default one
    app = FastAPI()

    @app.get("/loop")
    async def loop() -> dict:
        return {"loop": type(asyncio.get_running_loop()).__name__}

    factory = uvicorn.Config(app).get_loop_factory()
    made = factory() if factory is not None else asyncio.new_event_loop()
    expected = type(made).__name__
    made.close()
    with BackgroundServer(app) as server:
        assert httpx.get(server.url + "/loop").json() == {"loop": expected}
