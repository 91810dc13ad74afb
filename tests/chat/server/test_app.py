"""The app's assembly (``chat/server/app.py``): its keys, tenants' defaults, session and response stores and media URL
fetcher from the settings, a bare key ring never reloaded, and the guard in front of the whole app, also mounted
under a prefix. (Each route: tests/chat/server/routes/.)"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from chat.protocol.store import InMemorySessionStore
from chat.server.app import create_app, key_ring, server_policy
from chat.server.persistence.response_store import ResponseStore
from chat.server.persistence.session_db import SqliteSessionStore
from chat.server.settings import ServerSettings
from chat.server.tenancy.auth import KeyRing
from chat.server.tenancy.policy import TenantPolicy
from chat.server.tenancy.ratelimit import Limits
from chat.server.transport.media_urls import MediaURLMiddleware
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.tenancy.test_auth import KEY_A, KEY_B

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


def test_settings_read_keys_from_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\n")
    monkeypatch.setenv("TURNCACHE_API_KEYS", f"{KEY_B} bob")
    monkeypatch.setenv("TURNCACHE_API_KEYS_FILE", str(path))
    ring = key_ring(ServerSettings())
    assert ring.tenants() == {"alice", "bob"}
    assert KEY_B not in repr(ServerSettings())  # a SecretStr: never printed


def test_the_tenants_defaults_are_the_servers_settings():
    policy = server_policy(
        ServerSettings(tenant_concurrent_turns=2, tenant_tokens_per_minute=900, tenant_priority=-3, sessions_db=None)
    )
    assert policy.limits == Limits(concurrent_turns=2, tokens_per_minute=900) and policy.priority == -3
    assert server_policy(ServerSettings(sessions_db=None)) == TenantPolicy(Limits(), priority=0)


@pytest.fixture(scope="module")
def engine():
    from chat.engine.engine import Engine

    engine = Engine(FakeRuntime(), cache=None)
    yield engine
    engine.close()


def test_without_a_database_sessions_and_responses_live_in_memory_and_no_url_is_fetched(engine):
    app = create_app(engine, ServerSettings(sessions_db=None, max_sessions=5), model_name="fake")
    assert type(app.state.sessions) is InMemorySessionStore and app.state.sessions.max_sessions == 5
    assert type(app.state.responses) is ResponseStore
    assert not any(m.cls is MediaURLMiddleware for m in app.user_middleware)
    assert app.state.sessions.quota("anyone") is None  # the gate's open_sessions: no limit set
    app.state.sessions.close()


def test_a_sessions_file_and_media_hosts_are_what_the_settings_name(engine, tmp_path):
    settings = ServerSettings(
        sessions_db=str(tmp_path / "s.sqlite3"), media_url_hosts=["images.example.com"], tenant_open_sessions=3
    )
    app = create_app(engine, settings, model_name="fake")
    assert isinstance(app.state.sessions, SqliteSessionStore) and app.state.sessions.quota("alice") == 3
    (fetcher,) = [m for m in app.user_middleware if m.cls is MediaURLMiddleware]
    assert fetcher.kwargs["policy"].hosts == ("images.example.com",)
    app.state.sessions.close()


def test_a_bare_key_ring_is_kept_and_never_reloaded(engine):
    ring = KeyRing.from_sources(auth_token=KEY)
    app = create_app(engine, ServerSettings(sessions_db=None), model_name="fake", keys=ring)
    assert app.state.keys.ring is ring and not app.state.keys.reload() and app.state.keys.ring is ring
    app.state.sessions.close()
