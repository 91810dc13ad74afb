"""Sessions in PostgreSQL (``--sessions-db postgresql://...``): the store several ingresses share.

Live sessions stay in memory, as with SQLite (``chat/server/session_db.py``), but every change is written at once,
in one transaction, and only if the row is still what this process last read or wrote (its ``version``): the rows
of a session come from one process's copy, and two processes never overwrite each other's changes.

- ``create``: the row is inserted.
- ``save``: the header, and the messages after the first one that changed (O(new messages)), in one transaction,
  on the condition that the row's version is the one this process knows and that no *other live* process holds a
  turn in progress on it. A turn's start, its end and a settings change are one write each.
- ``get``: a session that is live here is checked against its row (one indexed read): if another process changed
  it since, it is read again, in place (every connection of this process bound to it sees the new state). A session
  not live here is read back, for its owner only.

**Conflicts.** When the condition fails, nothing is written, the session is read again in place, and ``save`` raises
``ProtocolError(conflict)`` for a turn's start or a settings change (the client's event is refused: it sees the
conversation as it now is and may send the event again). At a turn's end (the process already held the turn, so
this only happens if its connection to the database was lost and someone else took the session over meanwhile) the
reply is not written, and the conflict is logged and counted: the row keeps the other process's change.

**Turns cut off.** A row left ``generating`` by a process that is gone (its liveness lock is released with its
connection, ``pg_database.py``) comes back idle, with ``interrupted_turn_id`` naming that turn, exactly
as after a restart with SQLite. A row ``generating`` on a live process comes back idle too (the conversation before
that turn), but a turn or settings change on it gets ``conflict`` until that process ends its turn.

Writes and reads run on the caller's thread (the event loop): a few milliseconds per turn on a local network.
A database that cannot be reached is logged and counted; the sessions stay in memory and the next write of each
rewrites it whole (still on the version check).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from chat.protocol.content import ConversationMessage
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.ids import IdFactory, new_id
from chat.protocol.sampling import SamplingSettings
from chat.protocol.session import Session, SessionState
from chat.protocol.store import MAX_SESSIONS, InMemorySessionStore
from chat.server.persistence.pg_database import HOLDER_ALIVE, LOCK_CLASS, PgDatabase
from chat.server.persistence.session_rows import (
    Header,
    QmarkConnection,
    StoredSession,
    Work,
    current_version,
    delete_messages,
    pack,
    pack_tools,
    row_bytes,
    unpack,
)
from chat.server.persistence.session_writer import Snapshot, WriteStats, common_prefix

log = logging.getLogger("turncache.sessions")

_NOT_HELD_ELSEWHERE = (
    "(state = 'idle' OR holder = ANY(%s) OR NOT " + HOLDER_ALIVE.format(cls=LOCK_CLASS, col="holder") + ")"
)


class ConflictError(Exception):
    """The row changed since this process read it, or another live process runs a turn of it. Nothing written."""


@dataclass(slots=True)
class _Known:
    """What the database holds for a session, as this process last read or wrote it."""

    version: int  # the row's version
    header: Header
    ids: tuple[str, ...] | None  # its messages' ids in order; None: unknown (the next write rewrites them all)


class PostgresSessionStore(InMemorySessionStore):
    def __init__(
        self,
        url: str,
        max_sessions: int = MAX_SESSIONS,
        new_id: IdFactory = new_id,
        *,
        quota: Callable[[str], int | None] | None = None,
        database: PgDatabase | None = None,
    ) -> None:
        """Raises:
        SessionDbError: the database cannot be reached or migrated.
        """
        super().__init__(max_sessions=max_sessions, new_id=new_id, quota=quota)
        self.db = database or PgDatabase(url)  # also serves the stored responses (pg_responses.py)
        self.stats = WriteStats(Work())  # totals, for /metrics
        self.conflicts = 0  # writes refused by the version check, since start
        self._known: dict[str, _Known] = {}  # session id -> what the database holds, as last seen here
        self._turns: set[str] = set()  # turns this process started and has not ended (their rows are its own)
        self._closed = False

    # ---------------------------------------------------------------- the store

    def create(
        self, model: str, system: str | None = None, sampling: SamplingSettings | None = None, *, owner: str = ""
    ) -> Session:
        session = super().create(model, system, sampling, owner=owner)
        snap = Snapshot.of(session)
        try:
            work = self.db.run(lambda c: _insert(c, session.id, snap.header, self.db.holder))
            self._wrote(work)
            self._known[session.id] = _Known(1, snap.header, ())
        except Exception as exc:  # psycopg.Error: kept in memory, written whole next time
            self._failed(exc, session.id)
        return session

    def get(self, session_id: str, event_id: str | None = None, *, owner: str = "") -> Session:
        live = self._sessions.get(session_id)
        if live is None or live.state is SessionState.CLOSED:
            self._load(session_id, owner, None)
        elif live.owner == owner and live.state is SessionState.IDLE:
            self._refresh_if_changed(live)
        return super().get(session_id, event_id, owner=owner)

    def save(self, session: Session) -> None:
        super().save(session)
        if session.state is SessionState.CLOSED:  # closed for room: its row stays as last written
            return
        known = self._known.get(session.id)
        snap = Snapshot.of(session)
        ending = known is not None and known.header.turn_id in self._turns and snap.header.turn_id is None
        starting = snap.header.turn_id is not None and (known is None or known.header.turn_id != snap.header.turn_id)
        try:
            self._write(snap, known)
        except ConflictError:
            self.conflicts += 1
            if ending:
                log.warning("session %s was taken over elsewhere during a turn; its reply is not kept", session.id)
                self._turns.discard(known.header.turn_id)
                self._reload_into(session)
                return
            if starting:
                session.on_error(session.turn_id, ErrorCode.CONFLICT, "")  # the turn never started: back to idle
            if session.state is SessionState.IDLE:  # (a turn of ours still running keeps its state until it ends)
                self._reload_into(session)
            raise ProtocolError(
                ErrorCode.CONFLICT,
                f"session {session.id!r} was changed through another connection, or runs a turn there; nothing was "
                "changed here and the session was read again: send the event again",
            ) from None
        except Exception as exc:  # psycopg.Error (server gone, ...): kept in memory, rewritten whole next time
            self._failed(exc, session.id)
            return
        if ending:
            self._turns.discard(known.header.turn_id)
        if snap.header.turn_id is not None:
            self._turns.add(snap.header.turn_id)

    def flush(self, timeout: float | None = None) -> bool:
        """Every write is made before ``save`` returns: nothing is ever pending."""
        return True

    def write_stats(self) -> tuple[WriteStats, int]:
        return self.stats, 0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.db.close()

    # ---------------------------------------------------------------- writing

    def _write(self, snap: Snapshot, known: _Known | None) -> None:
        """Raises ConflictError (nothing written), or psycopg.Error."""
        holder, mine = self.db.holder, list(self.db.holders)
        ids = tuple(m.id for m in snap.messages)

        def work(c) -> tuple[Work, int]:
            if known is None:  # never written from here (a failed first write, or a read that failed)
                # a row we do not know the state of: read it first
                if current_version(QmarkConnection(c), snap.session_id):
                    raise ConflictError(snap.session_id)
                return _insert(c, snap.session_id, snap.header, holder, list(snap.messages)), 1
            start = common_prefix(known.ids, ids) if known.ids is not None else 0
            done, version = _update_header(c, snap.session_id, snap.header, known.version, holder, mine)
            done.add(delete_messages(QmarkConnection(c), snap.session_id, start))
            done.add(_insert_messages(c, snap.session_id, start, list(snap.messages[start:])))
            return done, version

        result, version = self.db.run(work)
        self._wrote(result)
        self._known[snap.session_id] = _Known(version, snap.header, ids)

    def _wrote(self, work: Work) -> None:
        self.stats.work.add(work)
        self.stats.transactions += 1

    def _failed(self, exc: Exception, session_id: str) -> None:
        self.stats.failures += 1
        known = self._known.get(session_id)
        if known is not None:
            known.ids = None  # the next write rewrites the messages whole (on the same version check)
        if isinstance(exc, self.db._psycopg.Error):
            log.warning("could not write session %s (%s); it is kept in memory", session_id, exc)
        else:
            log.error("could not write session %s; it is kept in memory", session_id, exc_info=exc)

    # ---------------------------------------------------------------- reading back

    def _refresh_if_changed(self, session: Session) -> None:
        known = self._known.get(session.id)
        try:
            version = self.db.run(lambda c: current_version(QmarkConnection(c), session.id), transaction=False)
        except self.db._psycopg.Error as exc:  # unreachable: serve what is in memory
            log.warning("could not check session %s against the database (%s)", session.id, exc)
            return
        if known is None or version != known.version:
            self._reload_into(session)

    def _reload_into(self, session: Session) -> None:
        """Read ``session``'s rows again into the live object (it stays the object every connection holds)."""
        self._known.pop(session.id, None)
        self._load(session.id, session.owner, session)

    def _load(self, session_id: str, owner: str, into: Session | None) -> None:
        """Read ``session_id`` for ``owner`` (into the live object ``into``, or as a new live session); do nothing
        if ``owner`` does not own it (``get`` then refuses it exactly as an id that does not exist).

        Raises:
            ProtocolError: ``internal`` when its rows cannot be read back.
        """
        try:
            found = self.db.run(lambda c: _read(c, session_id, owner, self.db.holders))
        except (ValueError, TypeError, KeyError, AttributeError, ValidationError) as exc:
            log.error("session %s could not be read back", session_id, exc_info=exc)
            raise ProtocolError(ErrorCode.INTERNAL, f"session {session_id!r} could not be read back") from None
        except self.db._psycopg.Error as exc:
            log.warning("could not read session %s (%s)", session_id, exc)
            raise ProtocolError(ErrorCode.UNAVAILABLE, "the sessions database cannot be reached; retry") from None
        if found is None:
            if into is not None:  # gone from the database (deleted by hand): keep serving the live copy
                self._known.pop(session_id, None)
            return
        stored, cut_off = found
        h = stored.header
        try:
            sampling = SamplingSettings.model_validate_json(h.sampling)
        except ValidationError:
            raise ProtocolError(ErrorCode.INTERNAL, f"session {session_id!r} could not be read back") from None
        session = into
        if session is None:
            session = Session(h.model, session_id=session_id, owner=owner, new_id=self._new_id)
        session.model, session.system, session.sampling = h.model, h.system, sampling
        session.messages = stored.messages
        session.interrupted_turn_id = h.interrupted_turn_id
        self._known[session_id] = _Known(stored.version, h, tuple(m.id for m in stored.messages))
        if into is None:
            self._make_room(owner)
            InMemorySessionStore.save(self, session)  # live again
        if cut_off:  # the turn's process is gone: the cut-off turn becomes part of the record
            try:
                self._write(Snapshot.of(session), self._known[session_id])
            except ConflictError:  # someone else took it over meanwhile: read on their next get
                self._known.pop(session_id, None)
            except Exception as exc:
                self._failed(exc, session_id)


# ---------------------------------------------------------------- rows (inside the caller's transaction)


def _insert(c, sid: str, h: Header, holder: int, messages: list[ConversationMessage] | None = None) -> Work:
    values = (sid, h.owner, h.model, h.system, h.sampling, h.state, h.turn_id, h.interrupted_turn_id)
    c.execute("INSERT INTO sessions VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, %s, %s)", (*values, time.time(), holder))
    work = Work(rows=1, bytes=row_bytes(values) + 24)
    if messages:
        work.add(_insert_messages(c, sid, 0, messages))
    return work


def _update_header(c, sid: str, h: Header, version: int, holder: int, mine: list[int]) -> tuple[Work, int]:
    """Raises ConflictError when the row is not at ``version``, or another live process holds a turn of it."""
    values = (h.model, h.system, h.sampling, h.state, h.turn_id, h.interrupted_turn_id)
    row = c.execute(
        "UPDATE sessions SET model = %s, system = %s, sampling = %s, state = %s, turn_id = %s, "
        "interrupted_turn_id = %s, version = version + 1, updated = %s, holder = %s "
        f"WHERE id = %s AND version = %s AND {_NOT_HELD_ELSEWHERE} RETURNING version",
        (*values, time.time(), holder, sid, version, mine),
    ).fetchone()
    if row is None:
        raise ConflictError(sid)
    return Work(rows=1, bytes=row_bytes(values) + 24), row[0]


def _insert_messages(c, sid: str, start: int, messages: list[ConversationMessage]) -> Work:
    work = Work()
    for position, message in enumerate(messages, start):
        content, media = pack(message)
        values = (message.id, message.role, content, message.finish_reason, pack_tools(message))
        c.execute("INSERT INTO messages VALUES (%s, %s, %s, %s, %s, %s, %s)", (sid, position, *values))
        work.rows += 1
        work.bytes += row_bytes(values) + len(sid) + 8
        for digest, payload in media.items():
            inserted = c.execute(
                "INSERT INTO media VALUES (%s, %s) ON CONFLICT (hash) DO NOTHING RETURNING hash", (digest, payload)
            ).fetchone()
            if inserted is not None:
                work.rows += 1
                work.bytes += len(digest) + len(payload)
            c.execute("INSERT INTO message_media VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (sid, position, digest))
            work.rows += 1
            work.bytes += len(sid) + 8 + len(digest)
    return work


def _read(c, sid: str, owner: str, mine: list[int]) -> tuple[StoredSession, bool] | None:
    """The session ``sid`` if ``owner`` owns it, and whether it was left generating by a process that is gone.

    Raises:
        ValueError: the rows are inconsistent (a gap in positions, a missing payload).
    """
    alive = HOLDER_ALIVE.format(cls=LOCK_CLASS, col="holder")
    row = c.execute(
        "SELECT model, system, sampling, state, turn_id, interrupted_turn_id, version, "
        f"(holder = ANY(%s) OR {alive}) FROM sessions WHERE id = %s AND owner = %s",
        (mine, sid, owner),
    ).fetchone()
    if row is None:
        return None
    *fields, version, holder_alive = row
    rows = c.execute(
        "SELECT position, id, role, content, finish_reason, tools FROM messages WHERE session_id = %s "
        "ORDER BY position",
        (sid,),
    ).fetchall()
    media = dict(
        c.execute(
            "SELECT hash, payload FROM media WHERE hash IN (SELECT hash FROM message_media WHERE session_id = %s)",
            (sid,),
        ).fetchall()
    )
    header = Header(owner, *fields)
    stored = StoredSession(header, version)
    for expected, (position, mid, role, content, finish_reason, tools) in enumerate(rows):
        if position != expected:
            raise ValueError(f"message {expected} of session {sid} is missing")
        try:
            value = unpack(content, media)
        except KeyError as exc:
            raise ValueError(f"a media payload of session {sid} is missing") from exc
        stored.messages.append(
            ConversationMessage.model_validate(
                {"id": mid, "role": role, "content": value, "finish_reason": finish_reason, **json.loads(tools or "{}")}
            )
        )
    cut_off = header.state == SessionState.GENERATING.value and not holder_alive
    if cut_off:  # comes back idle, the conversation before that turn, the turn named as interrupted
        stored.header = Header(owner, header.model, header.system, header.sampling, "idle", None, header.turn_id)
    return stored, cut_off
