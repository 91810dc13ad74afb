"""The PostgreSQL database (``chat/server/persistence/pg_database.py``) on a real server: versioned migrations applied
once, a later schema refused, an unreachable server named without its password, each process's liveness mark, and
one lost connection opened again."""

from __future__ import annotations

import os
import threading

import psycopg
import pytest

from chat.server.persistence.pg_database import SCHEMA_VERSION, PgDatabase
from chat.server.persistence.pg_sessions import PostgresSessionStore
from chat.server.persistence.session_rows import SessionDbError


def test_migrations_are_versioned_applied_once_and_a_later_schema_is_refused(postgres_url):
    databases, errors = [], []

    def open_one():
        try:
            databases.append(PgDatabase(postgres_url))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]  # four ingresses starting at once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(databases) == 4
    assert len({db.holder for db in databases}) == 4  # each its own liveness mark
    with psycopg.connect(postgres_url, autocommit=True) as c:
        assert c.execute("SELECT version FROM turncache_schema").fetchall() == [(SCHEMA_VERSION,)]
        c.execute("UPDATE turncache_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(SessionDbError, match="newer turncache"):
        PgDatabase(postgres_url)
    for db in databases:
        db.close()


def test_an_unreachable_server_is_refused_at_start_naming_it_without_its_password():
    with pytest.raises(SessionDbError) as info:
        PostgresSessionStore("postgresql://someone:hunter2@127.0.0.1:1/nothing")
    assert "127.0.0.1" in str(info.value) and "hunter2" not in str(info.value)


def test_a_sessions_holder_names_its_process(postgres_url):

    store = PostgresSessionStore(postgres_url)
    session = store.create("fake")
    with psycopg.connect(postgres_url) as c:
        (holder,) = c.execute("SELECT holder FROM sessions WHERE id = %s", (session.id,)).fetchone()
    assert store.db.holder_pid(holder) == os.getpid()
    store.close()
    assert PgDatabase(postgres_url).holder_pid(holder) is None  # its process let go


def test_a_lost_connection_is_opened_again_once_with_a_new_liveness_mark(postgres_url):
    db = PgDatabase(postgres_url)
    first = db.holder
    with psycopg.connect(postgres_url, autocommit=True) as other:  # the server cuts the connection (a restart)
        other.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"turncache pid {os.getpid()}",),
        )
    assert db.run(lambda c: c.execute("SELECT 1").fetchone()[0]) == 1  # the work is retried on a new connection
    assert db.holders[0] == first and len(db.holders) == 2 and db.holder != first
    assert db.holder_pid(db.holder) == os.getpid() and db.holder_pid(first) is None  # the old mark went with it
    db.close()
