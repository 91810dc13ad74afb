"""Keys without restarts: the server's :class:`~chat.server.tenancy.auth.KeyRing` held in a :class:`KeyStore` that can
read its sources again while the server runs.

When: on ``SIGHUP`` (``kill -HUP PID``), and when the keys file changes (its modification time or size, looked at
every ``--keys-poll-s`` seconds; 0: only on SIGHUP). Both are installed by :func:`watch_keys`, the app's lifespan.

What a reload does: the new ring replaces the old one at once, so a removed key is refused by the next request
(HTTP 401; a new WebSocket is closed with 1008) and a tenant's new limits apply to its next request. Listeners
(every live WebSocket) are told; a socket whose key was removed, or now names another tenant, sends a ``key_revoked``
error, is closed with 1008 (reason ``key_revoked``) and its turns are cancelled. Requests already running finish.
A source that is unreadable or malformed at a reload keeps the keys in force; the reason is logged (it names the
entry, never a key), and the next change or SIGHUP tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable

from chat.server.tenancy.auth import KeyRing, KeysError, Tenant
from chat.server.tenancy.policy import TenantPolicy

log = logging.getLogger("turncache.keys")
Listener = Callable[[KeyRing], None]  # told of every new ring, on the thread that reloaded


class KeyStore:
    """The keys in force, and how to read them again. ``load`` re-reads every source (None: there is nothing to
    re-read); ``path`` is the keys file whose changes :meth:`reload_if_changed` looks for."""

    def __init__(self, ring: KeyRing, load: Callable[[], KeyRing] | None = None, path: str | None = None) -> None:
        self.ring = ring  # the keys in force; replaced whole by a reload (one reference: readers see old or new)
        self._load = load  # builds a new ring from the sources; raises KeysError
        self._path = path  # the keys file, if any
        self._seen = self._stamp()  # (mtime_ns, size) of the keys file when last read
        self._listeners: list[Listener] = []  # live WebSockets, told of each new ring

    # the KeyRing's questions, always asked of the ring in force
    @property
    def open(self) -> bool:
        return self.ring.open

    def authenticate(self, credential: str | None) -> Tenant | None:
        return self.ring.authenticate(credential)

    def policy(self, tenant: str) -> TenantPolicy:
        return self.ring.policy(tenant)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Tell ``listener`` of every new ring; returns the call that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def reload(self) -> bool:
        """Read the sources again; True if the new keys are in force. A malformed source keeps the old keys (the
        reason is logged)."""
        self._seen = self._stamp()
        if self._load is None:
            log.info("keys: nothing to reload (no keys file)")
            return False
        try:
            ring = self._load()
        except KeysError as exc:
            log.error("keys: not reloaded, the keys in force stay: %s", exc)
            return False
        self.ring = ring
        log.info("keys: reloaded (%d tenants)", len(ring.tenants()))
        for listener in list(self._listeners):
            listener(ring)
        return True

    def reload_if_changed(self) -> bool:
        """:meth:`reload` when the keys file's modification time or size differs from the last read."""
        return self._path is not None and self._stamp() != self._seen and self.reload()

    def _stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            found = os.stat(os.path.expanduser(self._path))
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size


@contextlib.asynccontextmanager
async def watch_keys(keys: KeyStore, poll_s: float) -> AsyncIterator[None]:
    """While the server runs: reload ``keys`` on SIGHUP (where the event loop can take signals: the main thread) and
    when the keys file changes (every ``poll_s`` seconds; 0: never)."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, keys.reload)
        hooked = True
    except (ValueError, RuntimeError, NotImplementedError, AttributeError):  # not the main thread, or no SIGHUP
        hooked = False

    async def poll() -> None:
        while True:
            await asyncio.sleep(poll_s)
            keys.reload_if_changed()

    poller = asyncio.create_task(poll()) if poll_s > 0 else None
    try:
        yield
    finally:
        if poller is not None:
            poller.cancel()
        if hooked:
            loop.remove_signal_handler(signal.SIGHUP)
