"""The app mounted under a prefix (``root_path``: a proxy's, or a Ray Serve application's ``route_prefix``) checks
keys on the same routes as at ``/``."""

from fastapi.testclient import TestClient

from chat.server.app import create_app
from chat.server.settings import ServerSettings
from tests.chat.engine.fakes import FakeRuntime

KEY = "mounted-key-0123456789"


def test_a_mounted_app_still_refuses_requests_without_a_key():
    from chat.engine.engine import Engine

    engine = Engine(FakeRuntime(), cache=None)
    try:
        app = create_app(engine, ServerSettings(auth_token=KEY, sessions_db=None), model_name="fake")
        with TestClient(app, root_path="/rr") as client:
            assert client.get("/rr/health").status_code == 200
            for path in ("/rr/v1/models", "/rr/metrics"):
                assert client.get(path).status_code == 401, path
                assert client.get(path, headers={"authorization": f"Bearer {KEY}"}).status_code == 200, path
        app.state.sessions.close()
    finally:
        engine.close()
