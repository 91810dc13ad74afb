"""The disk tier of the prefix cache: entry and chunk files under one directory, written by a background thread.

Who does what:

- the thread that drives the :class:`~cache.PrefixCache` (the engine thread) decides what is written and deleted,
  keeps the bookkeeping (which record uses which chunk files, the bytes each record holds) and reads files back,
  synchronously, when a hit needs them (:meth:`DiskTier.load`);
- one writer thread (``turncache-disk``) writes and deletes files in the order they were asked for and reports how
  each write ended; the cache collects those reports at its next call (:meth:`DiskTier.completions`). Nothing else
  is shared between the two threads.

**Written behind the engine, not through it.** A write is not started as soon as it is queued: it waits
``write_delay_s`` (1 s) after being queued, then, while the engine computes (:meth:`DiskTier.defer`, which the
engine calls as it starts and stops having turns to step), until the engine has been idle for ``quiet_s`` (0.25 s),
but never longer than ``defer_s`` (30 s) past its due time. A record deleted meanwhile (its entry superseded by the
conversation's next turn, or dropped) is never written. So a chat's intermediate entries are not written at all, the
entry a conversation ends with is written once the engine has a moment, and a busy engine is not slowed by the disk
(a write that must go ahead under load runs on a thread at the lowest scheduling priority, ``nice`` 19, which the
operating system gives a core only when the engine's threads leave it). Jobs stay in their order: a write waits
behind the one before it. :meth:`DiskTier.flush` (and so ``close``) waits for none of this: it writes everything
queued at once.

A record whose write is still queued keeps the tensors it will write; :meth:`DiskTier.load` serves those. At startup
the directory is scanned: every entry file's header is read (no tensors) and becomes a *dormant* record of its
namespace digest, which the cache adopts when that namespace is first used (:meth:`DiskTier.adopt`). Files that are
unreadable, truncated, foreign (another format or version) or whose name does not match their content are skipped
with a warning and left in place; temporary files of a killed writer and chunk files no entry uses are deleted.

Write errors (a full disk, a read-only directory) are logged when they start and when they stop, counted, and make
:attr:`DiskTier.healthy` false until a write succeeds again; the cache keeps serving from memory meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cache.disk_format import (
    CHUNK_FORMAT,
    DEFAULT_CHUNK_TOKENS,
    ENTRY_FORMAT,
    SUFFIX,
    DiskFormatError,
    EntryHeader,
    UnserializableError,
    build_layers,
    check_kind,
    chunk_digests,
    chunk_metadata,
    chunk_tensors,
    describe_layers,
    entry_metadata,
    entry_name,
    entry_tensors,
    layout_digest,
    payload_bytes,
    read_metadata,
    read_tensors,
    write_file,
)
from cache.layers import LayerState, NormalKV
from cache.media import MediaSpan

log = logging.getLogger("turncache.cache.disk")

WRITE_DELAY_S = 1.0  # a queued write waits this long first: a chat's next turn supersedes its entry within it
DEFER_S = 30.0  # then at most this long past that while the engine computes
QUIET_S = 0.25  # the engine counts as idle after computing nothing for this long (not in the gap between two turns)
WRITER_NICE = 19  # the writer thread's scheduling priority (Linux: per thread; the lowest)

_HEX = frozenset("0123456789abcdef")


@dataclass(slots=True, eq=False)
class DiskRecord:
    """One entry file (written, queued, or found at startup) and what the cache needs to index it."""

    name: str  # file stem: a digest of (namespace digest, header JSON)
    namespace: str  # namespace digest
    header: EntryHeader  # tokens, media, extras, layer descriptions, chunks, layout, bytes
    text: str | None  # the header as stored (JSON) until the file is written; None after (the name vouches for it)
    layers: tuple[LayerState, ...] | None = field(default=None, repr=False)  # tensors to write while the write is
    # queued or running; None once the cache has collected its outcome, and for records found at startup
    written: bool = False  # the file is complete on disk
    cancelled: bool = False  # deleted before the writer got to it: the writer skips it
    mtime: float = 0.0  # last write or read (orders dormant records, oldest first)
    eid: int | None = None  # the cache entry that holds this record (set by the cache)
    queued_at: float = 0.0  # time.monotonic() when its write was queued

    @property
    def nbytes(self) -> int:
        return self.header.nbytes


class DiskTier:
    """Files of one cache directory. Only :meth:`pending`, the counters and :attr:`healthy` may be read from other
    threads; every other method belongs to the thread that drives the cache."""

    def __init__(
        self,
        path: str | os.PathLike,
        budget_bytes: int,
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        write_delay_s: float = WRITE_DELAY_S,
        defer_s: float = DEFER_S,
        quiet_s: float = QUIET_S,
    ) -> None:
        self.root = Path(path).expanduser() / "v1"  # files of format version 1 live here
        self.write_delay_s = write_delay_s  # a write waits this long after it was queued (its entry may go meanwhile)
        self.defer_s = defer_s  # then at most this long while the engine computes
        self.quiet_s = quiet_s  # the engine counts as idle once it has computed nothing for this long
        self._gate = threading.Condition()  # guards the three fields below; the writer waits on it
        self._busy = False  # the engine is computing (defer())
        self._idle_since = time.monotonic()  # when it last stopped
        self._hurry = 0  # flushes waiting: write everything queued at once
        self.budget = budget_bytes  # bytes of tensor data the files may hold
        self.chunk_tokens = chunk_tokens  # rows per chunk file
        self._entries_dir = self.root / "entries"
        self._chunks_dir = self.root / "chunks"
        self._refs: dict[str, int] = {}  # chunk digest -> records (held or dormant) that use it
        self._dormant: dict[str, list[DiskRecord]] = {}  # namespace digest -> records found at startup, oldest first
        self.dormant_bytes = 0  # bytes of the dormant records
        self._jobs: queue.Queue[tuple[str, Any] | None] = queue.Queue()  # for the writer thread, in order
        self._done: queue.SimpleQueue[tuple[DiskRecord, BaseException | None]] = queue.SimpleQueue()  # outcomes
        self._lock = threading.Lock()  # guards the fields below, written by both threads
        self._pending = 0  # writes queued or running
        self.counters = {"writes": 0, "write_errors": 0, "reads": 0, "read_errors": 0, "skipped_files": 0}
        self.healthy = True  # false after a failed write, until one succeeds; false for good if unusable
        self.last_error: str | None = None  # the latest write error, for logs and stats
        self.usable = True  # the directory exists and was scanned
        self._closed = False  # close() was called: nothing more is written or deleted
        self._warned_unserializable = False
        self._lock_file: Any = None  # held open with an exclusive lock: one process per directory
        try:
            self._entries_dir.mkdir(parents=True, exist_ok=True)
            self._chunks_dir.mkdir(parents=True, exist_ok=True)
            self._lock_file = open(self.root / "lock", "ab")  # noqa: SIM115 (held until close)
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # BlockingIOError: another process holds the lock
            if self._lock_file is not None:
                self._lock_file.close()
            self.usable = self.healthy = False
            self.last_error = f"{type(exc).__name__}: {exc}"
            reason = "another process uses it" if isinstance(exc, BlockingIOError) else str(exc)
            log.warning("prefix cache: disk tier off, cannot use %s: %s", self.root, reason)
            return
        self._scan()
        self._thread = threading.Thread(target=self._run, name="turncache-disk", daemon=True)
        self._thread.start()

    # ================================================================ records (the cache's thread)

    def plan(
        self,
        ns_digest: str,
        tokens: array,
        media: tuple[MediaSpan, ...],
        extras: tuple[tuple[int, Any], ...],
        layers: Sequence[LayerState],
        keys: array,
    ) -> DiskRecord | None:
        """The record an entry would be written as, or None if it cannot be stored (an extras value of a type the
        format cannot hold exactly). Nothing is queued: pass it to :meth:`write`."""
        chunked = any(isinstance(s, NormalKV) for s in layers)
        chunks = chunk_digests(ns_digest, keys, self.chunk_tokens) if chunked else ()
        header = EntryHeader(
            tokens,
            media,
            extras,
            describe_layers(layers),
            chunks,
            self.chunk_tokens,
            layout_digest(layers),
            payload_bytes(layers),
        )
        try:
            text = header.to_json()
        except UnserializableError as exc:
            if not self._warned_unserializable:
                log.warning("prefix cache: an entry is kept in memory only: %s", exc)
                self._warned_unserializable = True
            return None
        return DiskRecord(entry_name(ns_digest, text), ns_digest, header, text)

    def write(self, record: DiskRecord, layers: Sequence[LayerState]) -> None:
        """Queue the files of ``record``; its outcome comes back through :meth:`completions`."""
        if not self.writable:
            return
        record.layers = tuple(layers)
        record.queued_at = time.monotonic()
        for digest in record.header.chunks:
            self._refs[digest] = self._refs.get(digest, 0) + 1
        with self._lock:
            self._pending += 1
        self._jobs.put(("write", record))

    def delete(self, record: DiskRecord) -> None:
        """Queue the removal of ``record``'s file and of the chunk files no other record uses. A write of it that has
        not started is skipped."""
        record.cancelled = True
        paths = [self._entry_path(record.name)]
        for digest in record.header.chunks:
            left = self._refs.get(digest, 1) - 1
            if left > 0:
                self._refs[digest] = left
            else:
                self._refs.pop(digest, None)
                paths.append(self._chunk_path(digest))
        if self.usable and not self._closed:
            self._jobs.put(("delete", paths))  # a writer waiting for this record's turn skips it when it wakes

    def load(self, record: DiskRecord) -> tuple[LayerState, ...]:
        """The layer states of ``record`` (CPU tensors), verified against its files; or the tensors still queued.

        Raises:
            DiskFormatError: a file is missing, unreadable, corrupt, swapped or does not fit the record.
        """
        if record.layers is not None:
            return record.layers
        path = self._entry_path(record.name)
        try:
            meta, own = read_tensors(path, ENTRY_FORMAT)
            text = meta.get("entry")
            if meta.get("namespace") != record.namespace or entry_name(record.namespace, str(text)) != record.name:
                raise DiskFormatError(f"{path.name}: does not hold the entry its name promises")
            chunks = []
            for digest in record.header.chunks:
                chunk_meta, tensors = read_tensors(self._chunk_path(digest), CHUNK_FORMAT)
                if chunk_meta.get("chunk") != digest:
                    raise DiskFormatError(f"chunk {digest}: holds chunk {chunk_meta.get('chunk')!r} (swapped?)")
                chunks.append(tensors)
            layers = build_layers(record.header, own, chunks)
        except DiskFormatError as exc:
            with self._lock:
                self.counters["read_errors"] += 1
            log.warning("prefix cache: dropping a disk entry that cannot be read back: %s", exc)
            raise
        with self._lock:
            self.counters["reads"] += 1
        record.mtime = time.time()
        with contextlib.suppress(OSError):
            os.utime(path)  # last use, for the order of dormant records after a restart
        return layers

    def completions(self) -> list[tuple[DiskRecord, BaseException | None]]:
        """Writes that ended since the last call: (record, None) or (record, the error). Each record's queued
        tensors are released here."""
        out = []
        while True:
            try:
                record, error = self._done.get_nowait()
            except queue.Empty:
                return out
            record.layers = None
            record.text = None
            record.written = error is None and not record.cancelled
            out.append((record, error))

    def adopt(self, ns_digest: str) -> list[DiskRecord]:
        """Hand over the dormant records of a namespace (oldest first); later calls return nothing."""
        records = self._dormant.pop(ns_digest, [])
        self.dormant_bytes -= sum(r.nbytes for r in records)
        return records

    @property
    def writable(self) -> bool:
        """Whether :meth:`write` queues anything: the directory is usable and :meth:`close` was not called."""
        return self.usable and not self._closed

    @property
    def has_dormant(self) -> bool:
        return bool(self._dormant)

    def drop_oldest_dormant(self) -> int:
        """Delete the least recently used dormant record; return its bytes (0 when there is none)."""
        if not self._dormant:
            return 0
        ns = min(self._dormant, key=lambda k: self._dormant[k][0].mtime)
        record = self._dormant[ns].pop(0)
        if not self._dormant[ns]:
            del self._dormant[ns]
        self.dormant_bytes -= record.nbytes
        self.delete(record)
        return record.nbytes

    # ================================================================ any thread

    def defer(self, busy: bool) -> None:
        """Tell the writer whether the engine is computing (``busy``): due writes then wait, at most ``defer_s``
        past their due time, until it has been idle for ``quiet_s``. Any thread; cheap: only the engine's stop
        wakes the writer (one waiting for the engine to be quiet sees it busy again when it wakes)."""
        with self._gate:
            if busy == self._busy:
                return
            self._busy = busy
            if not busy:
                self._idle_since = time.monotonic()
                self._gate.notify_all()

    @property
    def pending(self) -> int:
        """Writes queued or running."""
        with self._lock:
            return self._pending

    def snapshot_counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is done, at most ``timeout`` seconds. Returns True if they all are."""
        if not self.usable or self._closed:
            return self.pending == 0
        done = threading.Event()
        with self._gate:
            self._hurry += 1  # the writer stops waiting for due times and idle engines
            self._gate.notify_all()
        self._jobs.put(("barrier", done))
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush (at most ``timeout`` seconds), then stop the writer: what is still queued then is abandoned (a
        write under way finishes), later writes and deletes are ignored. Returns True if everything queued was
        written."""
        if not self.usable or self._closed:
            return self.pending == 0
        deadline = None if timeout is None else time.monotonic() + timeout
        flushed = self.flush(timeout)
        left = self.pending
        self._closed = True
        with self._gate:
            self._gate.notify_all()
        self._jobs.put(None)
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():  # else a write is under way: the lock goes when the process does
            self._lock_file.close()
        if not flushed:
            log.warning("prefix cache: %d disk writes were still queued at shutdown; they are lost", left)
        return flushed

    # ================================================================ the writer thread

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # not on every OS: then it competes at normal priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            kind, arg = job
            if kind == "write":
                self._wait_for_turn(arg)
                self._write(arg)
            elif kind == "delete":
                self._delete(arg)
            else:
                with self._gate:
                    self._hurry -= 1
                arg.set()

    def _wait_for_turn(self, record: DiskRecord) -> None:
        """Wait until ``record`` may be written: ``write_delay_s`` after it was queued, then until the engine has
        been idle for ``quiet_s`` or ``defer_s`` more have passed; at once when it was deleted meanwhile, when a
        flush waits, or once the tier is closed. While the engine computes the writer sleeps through (no wake-up at
        the due time, none for a deletion: a thread at the lowest priority that takes the interpreter lock while the
        engine's threads hold both cores can keep the engine waiting for it); it wakes when the engine stops, when
        ``defer_s`` has run out, or for a flush."""
        due = record.queued_at + self.write_delay_s
        latest = due + self.defer_s
        with self._gate:
            while not (record.cancelled or self._hurry or self._closed):
                now = time.monotonic()
                if now >= latest:
                    return
                if self._busy:
                    wait = latest - now
                elif now < due:
                    wait = due - now
                else:
                    quiet = self._idle_since + self.quiet_s
                    if now >= quiet:
                        return
                    wait = quiet - now
                self._gate.wait(wait)  # woken by defer(False), flush() and close()

    def _write(self, record: DiskRecord) -> None:
        error: BaseException | None = None
        skipped = record.cancelled or self._closed  # after close() the queue is abandoned
        if not skipped:
            try:
                layers = record.layers
                assert layers is not None
                for index, digest in enumerate(record.header.chunks):
                    path = self._chunk_path(digest)
                    if not path.exists():  # shared with an entry written earlier
                        write_file(path, chunk_tensors(layers, index, self.chunk_tokens), chunk_metadata(digest))
                own = entry_tensors(layers, len(record.header.chunks) * self.chunk_tokens)
                assert record.text is not None
                write_file(self._entry_path(record.name), own, entry_metadata(record.namespace, record.text))
            except Exception as exc:  # OSError above all (full, read-only, removed); never let the thread die
                error = exc
        with self._lock:
            self._pending -= 1
            if skipped:
                pass
            elif error is None:
                self.counters["writes"] += 1
                if not self.healthy and self.usable:
                    log.warning("prefix cache: disk writes work again in %s", self.root)
                self.healthy = self.usable
            else:
                self.counters["write_errors"] += 1
                self.last_error = f"{type(error).__name__}: {error}"
                if self.healthy:
                    log.warning(
                        "prefix cache: cannot write to %s (%s); serving from memory, entries that leave memory are "
                        "lost until writes work again",
                        self.root,
                        self.last_error,
                    )
                self.healthy = False
        self._done.put((record, error))

    def _delete(self, paths: list[Path]) -> None:
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.debug("prefix cache: cannot delete %s: %s", path, exc)

    # ================================================================ startup

    def _scan(self) -> None:
        for tmp in (*self._entries_dir.glob(".*.tmp"), *self._chunks_dir.glob(".*.tmp")):
            tmp.unlink(missing_ok=True)  # a write cut short by a crash
        chunk_files = {p.stem for p in self._chunks_dir.glob(f"*{SUFFIX}")}
        records = []
        for path in sorted(self._entries_dir.glob(f"*{SUFFIX}")):
            try:
                records.append(self._read_record(path, chunk_files))
            except (DiskFormatError, OSError) as exc:
                self.counters["skipped_files"] += 1
                log.warning("prefix cache: skipping %s: %s", path, exc)
        records.sort(key=lambda r: r.mtime)
        for record in records:
            for digest in record.header.chunks:
                self._refs[digest] = self._refs.get(digest, 0) + 1
            self._dormant.setdefault(record.namespace, []).append(record)
            self.dormant_bytes += record.nbytes
        for stem in chunk_files - self._refs.keys():
            if len(stem) == 32 and set(stem) <= _HEX:
                self._chunk_path(stem).unlink(missing_ok=True)  # no entry uses it (a crash between writes)
        if records or self.counters["skipped_files"]:
            log.info(
                "prefix cache: %d entries (%.1f MiB) found in %s, %d files skipped",
                len(records),
                self.dormant_bytes / 2**20,
                self.root,
                self.counters["skipped_files"],
            )

    def _read_record(self, path: Path, chunk_files: set[str]) -> DiskRecord:
        """Raises DiskFormatError, OSError."""
        meta = read_metadata(path)
        check_kind(meta, ENTRY_FORMAT, path)
        ns, text = meta.get("namespace"), meta.get("entry")
        if not isinstance(ns, str) or not isinstance(text, str):
            raise DiskFormatError("no namespace or entry in its metadata")
        if entry_name(ns, text) != path.stem:
            raise DiskFormatError("its name does not match its content (renamed, swapped or edited)")
        header = EntryHeader.from_json(text)
        missing = [d for d in header.chunks if d not in chunk_files]
        if missing:
            raise DiskFormatError(f"{len(missing)} of its {len(header.chunks)} chunk files are missing")
        return DiskRecord(path.stem, ns, header, None, written=True, mtime=path.stat().st_mtime)

    # ================================================================ paths

    def _entry_path(self, name: str) -> Path:
        return self._entries_dir / f"{name}{SUFFIX}"

    def _chunk_path(self, digest: str) -> Path:
        return self._chunks_dir / f"{digest}{SUFFIX}"
