"""Run the app with uvicorn in a background thread (tests, benchmarks) or in the foreground (`turncache serve`)."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

from chat.protocol.limits import MAX_FRAME_BYTES
from chat.server.transport.backpressure import uvicorn_http_options

IDLE_CONNECTION_S = 30.0  # an app without server settings: how long a connection may stay silent before it closes


class BackgroundServer:
    """uvicorn in a thread on ``host``; ``port=0`` picks a free port. Use as a context manager; leaving it also closes
    the app's session store (which writes what is pending)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, ws_max_size: int = MAX_FRAME_BYTES):
        settings = getattr(app.state, "settings", None)  # the app's server settings, if create_app made it
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,  # never printed at "warning"; off, it costs no work per response either
            ws="websockets-sansio",
            ws_max_size=ws_max_size,
            lifespan="off",
            **uvicorn_http_options(
                getattr(settings, "idle_connection_s", IDLE_CONNECTION_S), getattr(settings, "send_buffer_kib", None)
            ),
        )
        self.app = app  # what it serves
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="uvicorn", daemon=True)
        self.port = port

    def _run(self) -> None:
        self.server.run()  # on the event loop `turncache serve` uses (uvicorn's choice: uvloop where installed)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        sessions = getattr(self.app.state, "sessions", None)
        if sessions is not None:
            sessions.close()
