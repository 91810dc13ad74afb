"""Sessions that survive a restart: the in-memory store, written through to SQLite off the event loop.

Live sessions stay in memory (least recently used idle ones are closed beyond ``max_sessions``); every ``create`` and
``save`` hands a snapshot to the writer thread (``session_writer.py``), which writes only what changed: one row per
message, media stored once by content hash (``session_rows.py``). ``get`` of a session that is not live (after a
restart, or after it was closed for room) reads it back from disk, for its owner only. A session whose row says it was
generating comes back idle, its conversation as it was before that turn, and ``interrupted_turn_id`` naming the turn
that was cut off; the client sees it in ``session.resumed``.

A database of the previous format (one JSON value per session) is migrated on open; its sessions get the owner
``legacy_owner`` (the tenant ``default``: --auth-token's, and everyone's on a server without keys).

Reads run on the caller's thread (the event loop), one indexed query per resume of a session that is not live.
Rows hold conversations in the clear: protect the file like the conversations themselves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.ids import IdFactory, new_id
from chat.protocol.sampling import SamplingSettings
from chat.protocol.session import Session, SessionState
from chat.protocol.store import MAX_SESSIONS, InMemorySessionStore
from chat.server.persistence.session_rows import open_database, read_session
from chat.server.persistence.session_writer import Known, SessionWriter, Snapshot, WriteStats
from chat.server.tenancy.auth import DEFAULT_TENANT

log = logging.getLogger("turncache.sessions")


class SqliteSessionStore(InMemorySessionStore):
    def __init__(
        self,
        path: str | Path,
        max_sessions: int = MAX_SESSIONS,
        new_id: IdFactory = new_id,
        *,
        legacy_owner: str = DEFAULT_TENANT,
        quota: Callable[[str], int | None] | None = None,
    ) -> None:
        """Raises:
        SessionDbError: the file cannot be opened, written or migrated.
        """
        super().__init__(max_sessions=max_sessions, new_id=new_id, quota=quota)
        self.path = Path(path)  # the database file
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = open_database(self.path, legacy_owner)  # reads, on the caller's thread
        self._lock = threading.Lock()  # serialises use of the reading connection
        self.writer = SessionWriter(self.path)  # writes, on its own thread
        self._closed = False

    def close(self) -> None:
        """Write what is pending (at most 10 s), then close the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        with self._lock:
            self._db.close()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write submitted so far is on disk (tests; a clean shutdown). False on timeout."""
        return self.writer.flush(timeout)

    def when_written(self, session_id: str, callback: Callable[[], None]) -> None:
        self.writer.when_written(session_id, callback)

    def write_stats(self) -> tuple[WriteStats, int]:
        """What the writer wrote since start, and the writes still pending (for /metrics)."""
        return self.writer.stats, self.writer.pending

    def create(
        self, model: str, system: str | None = None, sampling: SamplingSettings | None = None, *, owner: str = ""
    ) -> Session:
        session = super().create(model, system, sampling, owner=owner)
        self.writer.submit(Snapshot.of(session))
        return session

    def get(self, session_id: str, event_id: str | None = None, *, owner: str = "") -> Session:
        if session_id not in self:
            self._load(session_id, owner)
        return super().get(session_id, event_id, owner=owner)

    def save(self, session: Session) -> None:
        super().save(session)
        if session.state is not SessionState.CLOSED:  # a session closed for room keeps its last row
            self.writer.submit(Snapshot.of(session))

    # ---------------------------------------------------------------- reading back

    def _load(self, session_id: str, owner: str) -> None:
        """Make ``session_id`` live again if ``owner`` owns it on disk; do nothing if not (``get`` then refuses it
        exactly as an id that does not exist).

        Raises:
            ProtocolError: ``internal`` when its rows cannot be read back.
        """
        self.writer.flush(session_id=session_id)  # this process's pending writes of it are on disk first
        try:
            with self._lock:
                stored = read_session(self._db, session_id, owner)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("session %s could not be read back", session_id, exc_info=exc)
            raise ProtocolError(ErrorCode.INTERNAL, f"session {session_id!r} could not be read back") from None
        if stored is None:
            return
        h = stored.header
        try:
            sampling = SamplingSettings.model_validate_json(h.sampling)
        except ValidationError:
            raise ProtocolError(ErrorCode.INTERNAL, f"session {session_id!r} could not be read back") from None
        session = Session(
            h.model, system=h.system, sampling=sampling, session_id=session_id, owner=owner, new_id=self._new_id
        )
        session.messages = stored.messages
        ids = tuple(m.id for m in stored.messages)
        self.writer.submit(Known(session_id, h, stored.version, ids))
        session.interrupted_turn_id = h.turn_id if h.state == SessionState.GENERATING.value else h.interrupted_turn_id
        self._make_room(owner)
        super().save(session)  # live again
        if session.interrupted_turn_id != h.interrupted_turn_id or h.state != SessionState.IDLE.value:
            self.writer.submit(Snapshot.of(session))  # the cut-off turn is now part of the record
