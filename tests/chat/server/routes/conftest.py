"""What the route tests share: the app on a fake engine, driven in-process (Starlette's test client: no socket, no
server thread); each test module opens one for all its tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fastapi.testclient import TestClient

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.server.app import create_app
from chat.server.settings import ServerSettings
from tests.chat.engine.fakes import FakeRuntime


@contextlib.contextmanager
def app_client(runtime=None, **settings) -> Iterator[tuple[Engine, TestClient]]:
    """The app on ``runtime`` (a FakeRuntime by default) with ``settings``, sessions in memory."""
    runtime = runtime if runtime is not None else FakeRuntime()
    engine = Engine(runtime, cache=PrefixCache())
    app = create_app(engine, ServerSettings(**{"sessions_db": None, **settings}), model_name=runtime.name)
    try:
        with TestClient(app) as client:
            yield engine, client
    finally:
        app.state.sessions.close()
        engine.close()
