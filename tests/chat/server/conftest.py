import pytest

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.server.app import create_app
from chat.server.runner import BackgroundServer
from chat.server.settings import ServerSettings
from tests.chat.engine.fakes import FakeRuntime


def make_server(prefix_cache: bool = True, runtime=None, **settings):
    runtime = runtime if runtime is not None else FakeRuntime()
    engine = Engine(runtime, cache=PrefixCache() if prefix_cache else None)
    app = create_app(engine, ServerSettings(**settings), model_name=getattr(runtime, "name", "fake"))
    return engine, BackgroundServer(app)


@pytest.fixture
def server():
    engine, srv = make_server()
    with srv:
        yield srv
    engine.close()
