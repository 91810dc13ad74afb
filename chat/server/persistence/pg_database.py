"""The PostgreSQL database behind ``--sessions-db postgresql://...``: one connection, the schema and its migrations,
and this process's liveness mark.

Tables (the same rows as the SQLite format, ``chat/server/session_rows.py``, plus what several processes need)::

    turncache_schema  one row per component ("sessions"): the migrations applied (versioned, below)
    sessions          one row per session: owner, model, settings, state, `version` (+1 on every write), and
                      `holder`: the process that wrote it last (a turn in progress belongs to it)
    messages          one row per message, by (session_id, position); media payloads replaced by "@sha256:<hex>"
    media             one row per distinct payload, by its SHA-256
    message_media     which message refers to which payload
    responses         stored /v1/responses (previous_response_id), by id, owned by a tenant

Migrations are numbered; each runs once, in its own transaction, under an advisory lock, so processes that open the
database at once (several ingresses starting) apply each exactly once. A database of a later version is refused.

Liveness: every process holds, on its connection, the session-level advisory lock ``(LOCK_CLASS, holder)`` of its
own random ``holder`` id (its connection's ``application_name`` names its process id, so an operator can tell which
process holds a session: ``pg_locks`` joined with ``pg_stat_activity``). PostgreSQL drops it when the connection
goes (the process died or was cut off), so another process can tell a turn in progress on a live ingress (the
session is busy) from one cut off by a dead one (``HOLDER_ALIVE``, used inside the conditional writes).

All calls go through :meth:`PgDatabase.run`, which serialises use of the one connection across threads (the event
loop and the ASGI worker threads). Rows hold conversations in the clear: protect the database like them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from chat.server.persistence.session_rows import SessionDbError

log = logging.getLogger("turncache.sessions")
T = TypeVar("T")

LOCK_CLASS = 0x74630001  # the advisory lock space of turncache (first key of the two-key form)
MIGRATION_LOCK = 0  # (LOCK_CLASS, 0): held while migrating
APPLICATION = "turncache"  # the connection's application_name, then " pid <the process id>" (pg_stat_activity)
# A row's holder is alive while its advisory lock is held by some connection.
HOLDER_ALIVE = (
    "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = {cls}::oid "
    "AND objid = {col}::oid AND objsubid = 2)"
)

MIGRATIONS: list[list[str]] = [
    [  # 1: the format-3 rows of SQLite, a holder per session, stored responses
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            model TEXT NOT NULL,
            system TEXT,
            sampling TEXT NOT NULL,
            state TEXT NOT NULL,
            turn_id TEXT,
            interrupted_turn_id TEXT,
            version BIGINT NOT NULL,
            updated DOUBLE PRECISION NOT NULL,
            holder BIGINT NOT NULL
        )""",
        """CREATE TABLE messages (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            id TEXT NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            finish_reason TEXT,
            tools TEXT,
            PRIMARY KEY (session_id, position)
        )""",
        "CREATE TABLE media (hash TEXT PRIMARY KEY, payload TEXT NOT NULL)",
        """CREATE TABLE message_media (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            hash TEXT NOT NULL,
            PRIMARY KEY (session_id, position, hash)
        )""",
        "CREATE INDEX message_media_by_hash ON message_media (hash)",
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            messages TEXT NOT NULL,
            body TEXT NOT NULL,
            created DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX responses_by_age ON responses (created)",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(url)
    except Exception:  # not parseable: say only the scheme
        return url.split("://", 1)[0] + "://..."
    host, db = parts.get("host", ""), parts.get("dbname", "")
    return f"postgresql://{parts.get('user', '')}@{host}:{parts.get('port', '')}/{db}"


class PgDatabase:
    """One connection (autocommit: transactions are explicit), migrated on open, holding this process's mark."""

    def __init__(self, url: str) -> None:
        """Raises:
        SessionDbError: the server cannot be reached, or the schema is of a later version.
        """
        import psycopg

        self.url = url
        self._psycopg = psycopg
        self._lock = threading.Lock()
        self.holders: list[int] = []  # this process's holder ids, the current one last (a new one per reconnection)
        try:
            self._conn = self._connect()
            self._migrate()
        except psycopg.Error as exc:
            raise SessionDbError(f"--sessions-db {redacted(url)}: {exc}") from exc

    def holder_pid(self, holder: int) -> int | None:
        """The process id of the live process holding ``holder`` (None: nobody holds it), as it named itself."""
        row = self.run(
            lambda c: c.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE "
                "l.locktype = 'advisory' AND l.granted AND l.classid = %s::oid AND l.objid = %s::oid "
                "AND l.objsubid = 2",
                (LOCK_CLASS, holder),
            ).fetchone(),
            transaction=False,
        )
        if row is None or not row[0].startswith(APPLICATION + " pid "):
            return None
        return int(row[0].rsplit(" ", 1)[1])

    @property
    def holder(self) -> int:
        """This process's current holder id."""
        return self.holders[-1]

    def _connect(self):
        conn = self._psycopg.connect(
            self.url, autocommit=True, connect_timeout=10, application_name=f"{APPLICATION} pid {os.getpid()}"
        )
        while True:  # a random id whose lock nobody holds
            holder = random.randrange(1, 2**31)
            if conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, holder)).fetchone()[0]:
                self.holders.append(holder)
                return conn

    def _migrate(self) -> None:
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS turncache_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
            row = self._conn.execute("SELECT version FROM turncache_schema WHERE component = 'sessions'").fetchone()
            version = row[0] if row else 0
            if version > SCHEMA_VERSION:
                raise SessionDbError(
                    f"--sessions-db {redacted(self.url)}: written by a newer turncache (schema {version})"
                )
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number]:
                    self._conn.execute(statement)
                log.info("sessions database: migration %d applied", number + 1)
            self._conn.execute(
                "INSERT INTO turncache_schema VALUES ('sessions', %s) ON CONFLICT (component) DO UPDATE "
                "SET version = EXCLUDED.version",
                (SCHEMA_VERSION,),
            )

    def run(self, work: Callable[[object], T], *, transaction: bool = True) -> T:
        """``work(connection)``, inside one transaction unless told otherwise, on the one connection.

        A broken connection is opened again once (with a new holder id) and ``work`` retried.

        Raises:
            psycopg.Error: the server refused the work, or cannot be reached.
        """
        with self._lock:
            for attempt in (0, 1):
                if self._conn.closed:
                    self._conn = self._connect()
                try:
                    if not transaction:
                        return work(self._conn)
                    with self._conn.transaction():
                        return work(self._conn)
                except self._psycopg.OperationalError:
                    if attempt or not self._conn.closed:
                        raise
                    log.warning("the sessions database connection was lost; connecting again")
            raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Let go of this process's holder locks, then of the connection. The locks are released explicitly: a
        closed connection's server process ends a moment later, and until then its locks still name it as alive."""
        with self._lock:
            if not self._conn.closed:
                with contextlib.suppress(self._psycopg.Error):
                    self._conn.execute("SELECT pg_advisory_unlock_all()")
                self._conn.close()
