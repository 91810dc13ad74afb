"""The sessions database's format: one row per session, one row per message, media stored once by content hash.

Tables (format 3, ``PRAGMA user_version``)::

    sessions       one row per session: owner, model, settings, state, and `version` (+1 on every write)
    messages       one row per message, by (session_id, position); media payloads replaced by "@sha256:<hex>"
    media          one row per distinct payload (a data URL, or base64 for audio), by its SHA-256
    message_media  which message refers to which payload: a payload no message refers to is deleted

Format 3 added ``messages.tools`` (an assistant message's ``tool_calls``, a tool message's ``tool_call_id``, as
JSON); a format 2 file gets the column (NULL: no tool fields) on open.

A turn's write is O(its new messages): rows past the first changed position are deleted and the new ones inserted,
media already stored are referenced, not written again. Format 1 (one JSON value per session, the store before
this one) is migrated on open, inside one transaction, so two processes opening the file at once migrate it once.

Functions here take a ``sqlite3.Connection`` opened by :func:`open_database` and run inside the caller's
transaction. Rows hold conversations in the clear: protect the file like the conversations themselves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chat.protocol.content import ConversationMessage, to_wire

log = logging.getLogger("turncache.sessions")

FORMAT = 3  # PRAGMA user_version of this format
MEDIA_REF = "@sha256:"  # a stored payload's reference: never the start of a data URL or of base64
MEDIA_FIELDS = {
    "image_url": ("image_url", "url"),
    "video_url": ("video_url", "url"),
    "input_audio": ("input_audio", "data"),
}

SCHEMA = [
    """CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,            -- the tenant that created it; only it can read it back
        model TEXT NOT NULL,
        system TEXT,
        sampling TEXT NOT NULL,         -- JSON of SamplingSettings
        state TEXT NOT NULL,            -- "idle" | "generating"
        turn_id TEXT,                   -- the turn in progress when state is "generating"
        interrupted_turn_id TEXT,       -- reported by session.resumed until the next turn
        version INTEGER NOT NULL,       -- +1 on every write; a writer that expected another value rewrites it whole
        updated REAL NOT NULL
    )""",
    """CREATE TABLE messages (
        session_id TEXT NOT NULL,
        position INTEGER NOT NULL,      -- 0-based place in the conversation
        id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,          -- JSON; each media payload replaced by "@sha256:<hex>"
        finish_reason TEXT,
        tools TEXT,                     -- JSON {"tool_calls": [...]} or {"tool_call_id": ...}; NULL: neither
        PRIMARY KEY (session_id, position)
    ) WITHOUT ROWID""",
    """CREATE TABLE media (
        hash TEXT PRIMARY KEY,          -- SHA-256 (hex) of the payload
        payload TEXT NOT NULL           -- as the client sent it
    )""",
    """CREATE TABLE message_media (
        session_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (session_id, position, hash)
    ) WITHOUT ROWID""",
    "CREATE INDEX message_media_by_hash ON message_media (hash)",
]


class SessionDbError(Exception):
    """The sessions database cannot be opened or migrated (unwritable, another format). Names the file."""


@dataclass(frozen=True, slots=True)
class Header:
    """A session's row in ``sessions``, less its version."""

    owner: str  # the tenant that created it
    model: str  # the model that answers
    system: str | None  # the system prompt
    sampling: str  # JSON of SamplingSettings
    state: str  # "idle" | "generating"
    turn_id: str | None  # the turn in progress
    interrupted_turn_id: str | None  # a turn cut off by a restart


@dataclass(slots=True)
class Work:
    """What one write did to the file, for tests and /metrics: the turn's cost, independent of the conversation."""

    rows: int = 0  # rows inserted or updated
    bytes: int = 0  # bytes of the values in those rows
    deleted: int = 0  # rows deleted

    def add(self, other: Work) -> None:
        self.rows += other.rows
        self.bytes += other.bytes
        self.deleted += other.deleted


@dataclass(slots=True)
class StoredSession:
    """A session as read back: its header, version and messages."""

    header: Header
    version: int  # the row's version when read
    messages: list[ConversationMessage] = field(default_factory=list)


# ---------------------------------------------------------------- opening and migrating


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, waiting up to 30 s for another writer."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # with WAL: survives a crash of the process; a power loss may lose the last
    return db


def open_database(path: Path, legacy_owner: str) -> sqlite3.Connection:
    """Open (creating or migrating) the database at ``path``. Sessions of format 1 get ``legacy_owner``.

    Raises:
        SessionDbError: the file cannot be opened or written, or holds a format this code does not know.
    """
    try:
        db = connect(path)
        db.execute("BEGIN IMMEDIATE")
        try:
            _migrate(db, path, legacy_owner)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise SessionDbError(f"--sessions-db {path}: {exc}") from exc
    return db


def _migrate(db: sqlite3.Connection, path: Path, legacy_owner: str) -> None:
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version == FORMAT:
        return
    if version > FORMAT:
        raise SessionDbError(f"--sessions-db {path}: written by a newer turncache (format {version})")
    if version == 2:  # format 3 only adds the messages' tool fields
        db.execute("ALTER TABLE messages ADD COLUMN tools TEXT")
        db.execute(f"PRAGMA user_version = {FORMAT}")
        return
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    if columns and "messages" not in columns:
        raise SessionDbError(f"--sessions-db {path}: a 'sessions' table of an unknown format")
    if columns:
        db.execute("ALTER TABLE sessions RENAME TO sessions_v1")
    for statement in SCHEMA:
        db.execute(statement)
    if columns:
        _migrate_v1(db, legacy_owner)
    db.execute(f"PRAGMA user_version = {FORMAT}")


def _migrate_v1(db: sqlite3.Connection, owner: str) -> None:
    """Format 1 -> 2. A row whose conversation cannot be read is kept, as it was, in ``sessions_v1_unmigrated``."""
    rows = db.execute(
        "SELECT id, model, system, sampling, messages, state, turn_id, interrupted_turn_id, updated FROM sessions_v1"
    ).fetchall()
    unreadable = []
    for sid, model, system, sampling, messages, state, turn_id, interrupted, updated in rows:
        try:
            conversation = [ConversationMessage.model_validate(m) for m in json.loads(messages)]
        except (ValueError, TypeError, ValidationError):
            unreadable.append(sid)
            continue
        header = Header(owner, model, system, sampling, state, turn_id, interrupted)
        insert_header(db, sid, header, version=1, updated=updated)
        insert_messages(db, sid, 0, conversation)
    if unreadable:
        log.warning("%d sessions could not be migrated; kept in table sessions_v1_unmigrated", len(unreadable))
        db.execute("CREATE TABLE sessions_v1_unmigrated AS SELECT * FROM sessions_v1 WHERE 0")
        db.executemany(
            "INSERT INTO sessions_v1_unmigrated SELECT * FROM sessions_v1 WHERE id = ?", [(s,) for s in unreadable]
        )
    db.execute("DROP TABLE sessions_v1")
    log.info("migrated %d sessions to one row per message", len(rows) - len(unreadable))


# ---------------------------------------------------------------- messages <-> rows


def pack(message: ConversationMessage) -> tuple[str, dict[str, str]]:
    """The stored JSON of a message's content, and its media payloads by SHA-256."""
    content: Any = to_wire(message.content)
    media: dict[str, str] = {}
    if isinstance(content, list):
        for part in content:
            outer, inner = MEDIA_FIELDS.get(part.get("type"), (None, None))
            if outer is not None:
                payload = part[outer][inner]
                digest = hashlib.sha256(payload.encode()).hexdigest()
                media[digest] = payload
                part[outer][inner] = MEDIA_REF + digest
    return json.dumps(content), media


def pack_tools(message: ConversationMessage) -> str | None:
    """The stored JSON of a message's tool fields (None when it has none)."""
    fields = message.model_dump(include={"tool_calls", "tool_call_id"}, exclude_none=True)
    return json.dumps(fields) if fields else None


def unpack(content: str, media: dict[str, str]) -> Any:
    """Stored content JSON with its media payloads put back.

    Raises:
        KeyError: a referenced payload is missing.
    """
    value = json.loads(content)
    if isinstance(value, list):
        for part in value:
            outer, inner = MEDIA_FIELDS.get(part.get("type"), (None, None))
            if outer is not None and part[outer][inner].startswith(MEDIA_REF):
                part[outer][inner] = media[part[outer][inner][len(MEDIA_REF) :]]
    return value


# ---------------------------------------------------------------- writes (inside the caller's transaction)


def insert_header(db: sqlite3.Connection, sid: str, h: Header, *, version: int, updated: float | None = None) -> Work:
    values = (sid, h.owner, h.model, h.system, h.sampling, h.state, h.turn_id, h.interrupted_turn_id)
    db.execute(
        "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (*values, version, updated if updated is not None else time.time()),
    )
    return Work(rows=1, bytes=row_bytes(values) + 16)


def update_header(db: sqlite3.Connection, sid: str, old: Header, new: Header, version: int) -> Work | None:
    """Write what changed in the header if the row is still at ``version``; None if it is not (or is gone)."""
    state = (new.state, new.turn_id, new.interrupted_turn_id)
    changed = db.execute(
        "UPDATE sessions SET state = ?, turn_id = ?, interrupted_turn_id = ?, version = version + 1, updated = ? "
        "WHERE id = ? AND version = ?",
        (*state, time.time(), sid, version),
    ).rowcount
    if changed != 1:
        return None
    work = Work(rows=1, bytes=row_bytes(state) + 16)
    settings = (new.model, new.system, new.sampling)
    if settings != (old.model, old.system, old.sampling):
        db.execute("UPDATE sessions SET model = ?, system = ?, sampling = ? WHERE id = ?", (*settings, sid))
        work.bytes += row_bytes(settings)
    return work


def insert_messages(db: sqlite3.Connection, sid: str, start: int, messages: list[ConversationMessage]) -> Work:
    """Insert ``messages`` at positions ``start``, ``start + 1``, ...; store each new media payload once."""
    work = Work()
    for position, message in enumerate(messages, start):
        content, media = pack(message)
        values = (message.id, message.role, content, message.finish_reason, pack_tools(message))
        db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)", (sid, position, *values))
        work.rows += 1
        work.bytes += row_bytes(values) + len(sid) + 8
        for digest, payload in media.items():
            if db.execute("SELECT 1 FROM media WHERE hash = ?", (digest,)).fetchone() is None:
                db.execute("INSERT INTO media VALUES (?, ?)", (digest, payload))
                work.rows += 1
                work.bytes += len(digest) + len(payload)
            db.execute("INSERT OR IGNORE INTO message_media VALUES (?, ?, ?)", (sid, position, digest))
            work.rows += 1
            work.bytes += len(sid) + 8 + len(digest)
    return work


def delete_messages(db: Any, sid: str, start: int) -> Work:
    """Delete the messages at positions >= ``start``, and the payloads no other message refers to. ``db``: a SQLite
    connection, or anything with its ``execute`` taking ``?`` placeholders (:class:`QmarkConnection` for psycopg)."""
    query = "SELECT DISTINCT hash FROM message_media WHERE session_id = ? AND position >= ?"
    digests = [row[0] for row in db.execute(query, (sid, start)).fetchall()]
    work = Work()
    work.deleted += db.execute(
        "DELETE FROM message_media WHERE session_id = ? AND position >= ?", (sid, start)
    ).rowcount
    work.deleted += db.execute("DELETE FROM messages WHERE session_id = ? AND position >= ?", (sid, start)).rowcount
    for digest in digests:
        work.deleted += db.execute(
            "DELETE FROM media WHERE hash = ? AND NOT EXISTS (SELECT 1 FROM message_media WHERE hash = ?)",
            (digest, digest),
        ).rowcount
    return work


def current_version(db: Any, sid: str) -> int:
    """The session's stored version (0: not stored). ``db`` as for :func:`delete_messages`."""
    row = db.execute("SELECT version FROM sessions WHERE id = ?", (sid,)).fetchone()
    return row[0] if row else 0


# ---------------------------------------------------------------- reads


class QmarkConnection:
    """A DB-API connection whose placeholders are ``%s`` (psycopg) taking the ``?`` statements written here for
    SQLite, for the statements both stores share (no ``?`` in them but placeholders)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, query: str, params: tuple = ()) -> Any:
        return self.conn.execute(query.replace("?", "%s"), params)


def read_session(db: sqlite3.Connection, sid: str, owner: str) -> StoredSession | None:
    """The session ``sid`` if ``owner`` owns it, else None (the same answer for a session that does not exist).

    Runs its own read transaction, so the header and the messages are of one moment.

    Raises:
        ValueError: the rows are inconsistent (a gap in positions, a missing payload, content that does not validate).
    """
    db.execute("BEGIN")
    try:
        row = db.execute(
            "SELECT model, system, sampling, state, turn_id, interrupted_turn_id, version FROM sessions "
            "WHERE id = ? AND owner = ?",
            (sid, owner),
        ).fetchone()
        if row is None:
            return None
        *fields, version = row
        rows = db.execute(
            "SELECT position, id, role, content, finish_reason, tools FROM messages WHERE session_id = ? "
            "ORDER BY position",
            (sid,),
        ).fetchall()
        media = dict(
            db.execute(
                "SELECT hash, payload FROM media WHERE hash IN (SELECT hash FROM message_media WHERE session_id = ?)",
                (sid,),
            ).fetchall()
        )
    finally:
        db.execute("COMMIT")
    stored = StoredSession(Header(owner, *fields), version)
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
    return stored


def row_bytes(values: tuple) -> int:
    """The bytes a row's values hold, as the write statistics count them (a number: 8)."""
    return sum(len(v.encode()) if isinstance(v, str) else 8 for v in values if v is not None)
