"""Sessions that survive a restart: the in-memory store, written through to SQLite (standard library).

Live sessions stay in memory (least recently used idle ones are closed beyond ``max_sessions``); every ``create`` and
``save`` also writes the session's row. ``get`` of a session that is not live (after a restart, or after it was
closed for room) reads it back from disk. A session whose row says it was generating comes back idle, its
conversation as it was before that turn, and ``interrupted_turn_id`` naming the turn that was cut off; the client
sees it in ``session.resumed``.

One connection, used from the server's event loop; a lock guards it anyway. Rows hold conversations in the clear:
protect the file like the conversations themselves.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from chat.protocol.content import ConversationMessage
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.ids import IdFactory, new_id
from chat.protocol.sampling import SamplingSettings
from chat.protocol.session import Session, SessionState
from chat.protocol.store import MAX_SESSIONS, InMemorySessionStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    system TEXT,
    sampling TEXT NOT NULL,      -- JSON of SamplingSettings
    messages TEXT NOT NULL,      -- JSON list of ConversationMessage
    state TEXT NOT NULL,         -- "idle" | "generating"
    turn_id TEXT,                -- the turn in progress when state is "generating"
    interrupted_turn_id TEXT,    -- reported by session.resumed until the next turn
    updated REAL NOT NULL
)
"""


class SqliteSessionStore(InMemorySessionStore):
    def __init__(self, path: str | Path, max_sessions: int = MAX_SESSIONS, new_id: IdFactory = new_id) -> None:
        super().__init__(max_sessions=max_sessions, new_id=new_id)
        self.path = Path(path)  # the database file
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)
        self._lock = threading.Lock()  # serialises use of the connection

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create(self, model: str, system: str | None = None, sampling: SamplingSettings | None = None) -> Session:
        session = super().create(model, system, sampling)
        self._write(session)
        return session

    def get(self, session_id: str, event_id: str | None = None) -> Session:
        if session_id not in self:
            session = self._read(session_id)
            if session is not None:
                if len(self) >= self.max_sessions:
                    self._evict_one()
                super().save(session)  # live again (may close the least recently used idle one)
        return super().get(session_id, event_id)

    def save(self, session: Session) -> None:
        super().save(session)
        if session.state is not SessionState.CLOSED:  # a session closed for room keeps its last row
            self._write(session)

    # ---------------------------------------------------------------- rows

    def _write(self, session: Session) -> None:
        row = (
            session.id,
            session.model,
            session.system,
            session.sampling.model_dump_json(),
            json.dumps([m.model_dump(mode="json", exclude_none=True) for m in session.messages]),
            session.state.value,
            session.turn_id,
            session.interrupted_turn_id,
            time.time(),
        )
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def _read(self, session_id: str) -> Session | None:
        with self._lock:
            row = self._db.execute(
                "SELECT model, system, sampling, messages, state, turn_id, interrupted_turn_id FROM sessions "
                "WHERE id = ?",
                (session_id,),
            ).fetchone()
        if row is None:
            return None
        model, system, sampling, messages, state, turn_id, interrupted = row
        try:
            session = Session(
                model,
                system=system,
                sampling=SamplingSettings.model_validate_json(sampling),
                session_id=session_id,
                new_id=self._new_id,
            )
            session.messages = [ConversationMessage.model_validate(m) for m in json.loads(messages)]
        except ValueError as exc:
            raise ProtocolError(ErrorCode.INTERNAL, f"session {session_id!r} could not be read back") from exc
        session.interrupted_turn_id = turn_id if state == SessionState.GENERATING.value else interrupted
        if session.interrupted_turn_id != interrupted:
            self._write(session)  # the cut-off turn is now part of the record
        return session
