"""Where sessions and stored responses are kept: the storage interface, and the store a ``--sessions-db`` names.

``--sessions-db`` is a file path (SQLite: one process, ``session_db.py``) or a ``postgresql://`` URL
(PostgreSQL: one database several processes share, e.g. the ingresses of a cluster, ``pg_sessions.py``);
without it sessions live in memory only. Stored responses (``previous_response_id``) are kept in memory, except with
PostgreSQL, where they are rows of the same database, so that any ingress continues any response.

Both database stores are :class:`DurableSessionStore`: the session store interface of ``chat.protocol.store``
(``create``, ``get``, ``save``, ``when_written``, ``close``) with the same semantics (tenant-owned sessions, a turn
committed when it ends, a turn cut off by a dead process reported as ``interrupted_turn_id``), plus what the server
reads of their writing. Both response stores are :class:`ResponseStorage`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from chat.protocol.ids import IdFactory, new_id
from chat.protocol.sampling import SamplingSettings
from chat.protocol.session import Session
from chat.protocol.store import MAX_SESSIONS, InMemorySessionStore
from chat.server.persistence.response_store import ResponseStore, StoredResponse
from chat.server.persistence.session_writer import WriteStats

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


@runtime_checkable
class DurableSessionStore(Protocol):
    """A session store that keeps sessions beyond its process (SQLite, PostgreSQL)."""

    def create(
        self, model: str, system: str | None = None, sampling: SamplingSettings | None = None, *, owner: str = ""
    ) -> Session: ...

    def get(self, session_id: str, event_id: str | None = None, *, owner: str = "") -> Session: ...

    def save(self, session: Session) -> None: ...

    def when_written(self, session_id: str, callback: Callable[[], None]) -> None: ...

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every change saved so far is durable; False on timeout."""
        ...

    def write_stats(self) -> tuple[WriteStats, int]:
        """What was written since start, and the writes still pending (for /metrics)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ResponseStorage(Protocol):
    """Stored /v1/responses, owned by their tenant (another tenant's id reads as missing)."""

    def put(self, response_id: str, stored: StoredResponse) -> None: ...

    def get(self, response_id: str, owner: str) -> StoredResponse | None: ...

    def delete(self, response_id: str, owner: str) -> bool: ...


def is_postgres(target: str | None) -> bool:
    return bool(target) and target.startswith(POSTGRES_SCHEMES)


def open_session_store(
    target: str | None,
    max_sessions: int = MAX_SESSIONS,
    *,
    quota: Callable[[str], int | None] | None = None,
    new_id: IdFactory = new_id,
) -> InMemorySessionStore:
    """The store ``--sessions-db`` names: memory (None or ''), a PostgreSQL URL, else an SQLite file.

    Raises:
        SessionDbError: the database cannot be opened, reached or migrated.
    """
    if not target:
        return InMemorySessionStore(max_sessions=max_sessions, new_id=new_id, quota=quota)
    if is_postgres(target):
        from chat.server.persistence.pg_sessions import PostgresSessionStore

        return PostgresSessionStore(target, max_sessions=max_sessions, new_id=new_id, quota=quota)
    from chat.server.persistence.session_db import SqliteSessionStore

    return SqliteSessionStore(target, max_sessions=max_sessions, new_id=new_id, quota=quota)


def response_store_for(sessions: InMemorySessionStore) -> ResponseStorage:
    """Stored responses beside ``sessions``: in its PostgreSQL database, else in memory."""
    from chat.server.persistence.pg_sessions import PostgresSessionStore

    if isinstance(sessions, PostgresSessionStore):
        from chat.server.persistence.pg_responses import PostgresResponseStore

        return PostgresResponseStore(sessions.db)
    return ResponseStore()
