"""What the cluster sends to Ray's workers: settings without any API key source."""

import pytest
from fastapi.testclient import TestClient

from chat.cluster.settings import without_keys
from chat.server.settings import ServerSettings

pytest.importorskip("ray", reason="the cluster extra (turncache[cluster]) is not installed")


def keyed(tmp_path) -> ServerSettings:
    keys = tmp_path / "keys"
    keys.write_text("alice-key-0123456789abcdef alice\n")
    return ServerSettings(
        auth_token="token-0123456789abcdef",
        api_keys="bob-key-fedcba9876543210 bob",
        api_keys_file=str(keys),
        sessions_db=str(tmp_path / "sessions.sqlite3"),
    )


def test_settings_for_workers_carry_no_key_source(tmp_path):
    settings = without_keys(keyed(tmp_path))
    assert (settings.auth_token, settings.api_keys, settings.api_keys_file) == (None, None, None)
    assert settings.sessions_db == str(tmp_path / "sessions.sqlite3")  # the rest is untouched


def test_a_replicas_private_app_answers_metrics_without_a_key_and_has_no_session_store(tmp_path):
    from chat.cluster.replica import replica_settings
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from tests.chat.engine.fakes import FakeRuntime

    settings = replica_settings(keyed(tmp_path))
    assert settings.sessions_db is None
    engine = Engine(FakeRuntime(), cache=None)
    try:
        app = create_app(engine, settings, model_name="fake")
        with TestClient(app) as client:
            assert client.get("/metrics").status_code == 200
        app.state.sessions.close()
    finally:
        engine.close()
    assert not (tmp_path / "sessions.sqlite3").exists()
