"""Session writes off the event loop: one thread, its own connection, a queue of snapshots.

The event loop hands over a :class:`Snapshot` after every change (cheap: the header's fields and a tuple of the
message objects, which are never mutated); the writer thread packs and writes them. It remembers, per session, the
version and message ids it last wrote (or that were read back, see :class:`Known`), so a turn writes only the
messages after the first one that changed: O(new messages), whatever the length of the conversation. What a batch of
snapshots holds is written in one transaction, the latest snapshot of each session only.

Two processes may share the file: each write checks the row's version; a row someone else changed since is rewritten
whole from this process's snapshot (the last writer wins, the rows of a session always come from one snapshot).

A failed write (disk full, read-only file, ...) is logged and counted; the sessions stay in memory and their next
write rewrites them whole. A process killed before the queue drained loses those writes (milliseconds' worth);
``close`` writes what is pending.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chat.protocol.content import ConversationMessage
from chat.protocol.session import Session
from chat.server.persistence.session_rows import (
    Header,
    Work,
    connect,
    current_version,
    delete_messages,
    insert_header,
    insert_messages,
    update_header,
)

log = logging.getLogger("turncache.sessions")
MAX_BATCH = 256  # snapshots written in one transaction at most


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session's state to write, taken on the event loop."""

    session_id: str  # which session
    header: Header  # its row in `sessions`
    messages: tuple[ConversationMessage, ...]  # its whole conversation (references, not copies)

    @classmethod
    def of(cls, session: Session) -> Snapshot:
        state = "generating" if session.turn_id is not None else "idle"
        header = Header(
            session.owner,
            session.model,
            session.system,
            session.sampling.model_dump_json(),
            state,
            session.turn_id,
            session.interrupted_turn_id,
        )
        return cls(session.id, header, tuple(session.messages))


@dataclass(frozen=True, slots=True)
class Known:
    """What the file holds for a session, as just read back: lets the next write be incremental."""

    session_id: str  # which session
    header: Header  # its row as read
    version: int  # the row's version as read
    ids: tuple[str, ...]  # its messages' ids, in order


@dataclass(slots=True)
class WriteStats:
    """Totals since start, for tests and /metrics."""

    work: Work  # rows and bytes written, rows deleted
    transactions: int = 0  # batches committed
    failures: int = 0  # batches that failed: their sessions stay in memory and are rewritten whole next time


class SessionWriter:
    """The writer thread. ``submit`` from any thread; ``flush`` waits; ``close`` writes what is pending and stops."""

    def __init__(self, path: Path) -> None:
        self.stats = WriteStats(Work())  # totals; read them under no lock (ints), or after flush()
        self._db = connect(path)  # used by the writer thread only
        self._queue: queue.SimpleQueue[Snapshot | Known | None] = queue.SimpleQueue()  # None stops the thread
        self._done = threading.Condition()  # notified after every batch
        self._submitted = 0  # operations submitted
        self._finished = 0  # operations written (or failed)
        self._pending: Counter[str] = Counter()  # session id -> operations not yet finished
        self._waiters: dict[str, list[Callable[[], None]]] = {}  # session id -> called once nothing is pending
        self._known: dict[str, Known] = {}  # writer thread only: what the file holds, as this process last saw it
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="turncache-sessions", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Operations not yet written."""
        return self._submitted - self._finished

    def submit(self, op: Snapshot | Known) -> None:
        with self._done:
            if self._closed:
                return
            self._submitted += 1
            self._pending[op.session_id] += 1
            self._queue.put(op)

    def flush(self, timeout: float | None = None, session_id: str | None = None) -> bool:
        """Wait until what was submitted before the call (of ``session_id`` only, if given) is written. False on
        timeout."""
        with self._done:
            if session_id is not None:
                return self._done.wait_for(lambda: not self._pending[session_id], timeout)
            target = self._submitted
            return self._done.wait_for(lambda: self._finished >= target, timeout)

    def when_written(self, session_id: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` once nothing submitted for ``session_id`` is pending: now, or on the writer thread (also
        when the write failed: the session is then kept in memory only, and the failure is logged)."""
        with self._done:
            if self._pending[session_id]:
                self._waiters.setdefault(session_id, []).append(callback)
                return
            del self._pending[session_id]
        _call(callback)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending (waiting at most ``timeout`` seconds), then stop the thread. Idempotent."""
        with self._done:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("session writes still pending after %.0f s; they are lost", timeout)
        else:
            self._db.close()

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ops = [op for op in batch if op is not None]
            if ops:
                self._write(ops)
            ready: list[Callable[[], None]] = []
            with self._done:
                self._finished += len(ops)
                for op in ops:
                    self._pending[op.session_id] -= 1
                    if not self._pending[op.session_id]:
                        del self._pending[op.session_id]
                        ready += self._waiters.pop(op.session_id, [])
                self._done.notify_all()
            for callback in ready:
                _call(callback)
            if len(ops) < len(batch):
                return

    def _write(self, ops: list[Snapshot | Known]) -> None:
        last = {op.session_id: i for i, op in enumerate(ops) if isinstance(op, Snapshot)}
        work = Work()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for i, op in enumerate(ops):
                if isinstance(op, Known):
                    self._known[op.session_id] = op
                elif last[op.session_id] == i:  # an older snapshot of a session is superseded by its newest
                    work.add(self._write_one(op))
            self._db.execute("COMMIT")
        except Exception as exc:  # sqlite3.Error (disk full, read-only, ...); anything else is a bug, logged as one
            self.stats.failures += 1
            if isinstance(exc, sqlite3.Error):
                log.warning("could not write %d sessions (%s); they are kept in memory", len(last), exc)
            else:
                log.error("could not write %d sessions; they are kept in memory", len(last), exc_info=exc)
            for sid in {op.session_id for op in ops}:
                self._known.pop(sid, None)  # unknown now: the next write rewrites the session whole
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            return
        self.stats.work.add(work)
        self.stats.transactions += 1

    def _write_one(self, snap: Snapshot) -> Work:
        sid, ids = snap.session_id, tuple(m.id for m in snap.messages)
        known = self._known.get(sid)
        work = None
        if known is not None:
            work = update_header(self._db, sid, known.header, snap.header, known.version)
        if work is not None:
            start = common_prefix(known.ids, ids)
            work.add(delete_messages(self._db, sid, start))
            work.add(insert_messages(self._db, sid, start, list(snap.messages[start:])))
            version = known.version + 1
        else:  # new here, or changed by another process since: rewrite it whole
            version = current_version(self._db, sid) + 1
            work = insert_header(self._db, sid, snap.header, version=version)
            work.add(delete_messages(self._db, sid, 0))
            work.add(insert_messages(self._db, sid, 0, list(snap.messages)))
        self._known[sid] = Known(sid, snap.header, version, ids)
        return work


def _call(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # e.g. the event loop of a socket that is gone: nothing is waiting any more
        log.debug("a write callback failed", exc_info=True)


def common_prefix(old: tuple[str, ...], new: tuple[str, ...]) -> int:
    """How many leading message ids ``old`` and ``new`` share, found from the end: O(changed messages).

    A message id is made once, with its history: two conversations that hold the same id at the same position hold
    the same messages before it (sessions only ever append, or cut and append new messages).
    """
    n = min(len(old), len(new))
    while n > 0 and old[n - 1] != new[n - 1]:
        n -= 1
    return n
