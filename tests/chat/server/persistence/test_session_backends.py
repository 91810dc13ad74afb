"""Which store ``--sessions-db`` names (``chat/server/persistence/session_backends.py``): memory without one, SQLite
for a file, PostgreSQL for a ``postgresql://`` URL; stored responses in the PostgreSQL database beside its sessions,
else in memory. (The stores' shared semantics: ``test_session_stores.py``.)"""

from __future__ import annotations

import pytest

from chat.protocol.store import InMemorySessionStore
from chat.server.persistence.pg_responses import PostgresResponseStore
from chat.server.persistence.pg_sessions import PostgresSessionStore
from chat.server.persistence.response_store import ResponseStore
from chat.server.persistence.session_backends import (
    DurableSessionStore,
    ResponseStorage,
    is_postgres,
    open_session_store,
    response_store_for,
)
from chat.server.persistence.session_db import SqliteSessionStore


@pytest.mark.parametrize("target", [None, ""])
def test_without_a_database_sessions_and_responses_live_in_memory(target):
    quota = lambda owner: 1  # noqa: E731
    store = open_session_store(target, max_sessions=3, quota=quota)
    assert type(store) is InMemorySessionStore and not isinstance(store, DurableSessionStore)
    assert (store.max_sessions, store.quota) == (3, quota)
    responses = response_store_for(store)
    assert type(responses) is ResponseStore and isinstance(responses, ResponseStorage)


def test_a_file_path_is_an_sqlite_store_with_responses_in_memory(tmp_path):
    quota = lambda owner: 1  # noqa: E731
    store = open_session_store(str(tmp_path / "sessions.sqlite3"), max_sessions=7, quota=quota)
    assert isinstance(store, SqliteSessionStore) and isinstance(store, DurableSessionStore)
    assert (store.max_sessions, store.quota) == (7, quota) and (tmp_path / "sessions.sqlite3").exists()
    assert type(response_store_for(store)) is ResponseStore
    store.close()


def test_a_postgresql_url_is_a_postgres_store_with_its_responses_in_the_same_database(postgres_url):
    store = open_session_store(postgres_url)
    assert isinstance(store, PostgresSessionStore) and isinstance(store, DurableSessionStore)
    responses = response_store_for(store)
    assert isinstance(responses, PostgresResponseStore) and isinstance(responses, ResponseStorage)
    assert responses.db is store.db  # one connection, closed with the session store
    store.close()


@pytest.mark.parametrize(
    ("target", "postgres"),
    [
        ("postgresql://u@h/db", True),
        ("postgres://u@h/db", True),
        ("/var/lib/sessions.sqlite3", False),
        ("postgresql.sqlite3", False),
        ("", False),
        (None, False),
    ],
)
def test_only_a_postgresql_url_names_postgres(target, postgres):
    assert is_postgres(target) is postgres
