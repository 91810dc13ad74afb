"""Engine events onto the event loop in batches: one wake-up of the loop for everything the engine delivered since
the last one, not one per token.

The engine's worker delivers a step's events one turn after another (``Engine._deliver``). Handing each to the loop
with ``loop.call_soon_threadsafe`` writes to the loop's wake-up pipe once per event and per token: at 32 sessions,
32 system calls and as many loop iterations a step, each taking the GIL from the engine's thread and a core from its
OpenMP workers. A :class:`LoopRelay` queues the calls and asks the loop for one wake-up while none is pending; the
loop then runs every call queued so far, in the order they were made::

    relay = relay_for(asyncio.get_running_loop())
    engine.submit(request, lambda event: relay.call(on_event, turn_id, event))   # on_event runs on the loop

One relay per loop (:func:`relay_for`), shared by every connection on it, so one step's events for all sessions
come in one wake-up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("turncache.relay")


class LoopRelay:
    """Calls made from any thread, run on ``loop`` in the order they were made, batched (see the module docstring).
    A call made after the loop closed is dropped, as ``call_soon_threadsafe`` would have failed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # where the calls run
        self._lock = threading.Lock()  # guards _pending
        self._pending: list[tuple[Callable[..., Any], tuple]] = []  # calls not yet run; non-empty = a wake-up asked
        self.wakeups = 0  # wake-ups asked of the loop so far (each runs every call queued before it)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, after every call made before it (thread-safe, never blocks)."""
        with self._lock:
            self._pending.append((fn, args))
            if len(self._pending) > 1:
                return  # a wake-up is already on its way and will run this too
        self.wakeups += 1
        try:
            self.loop.call_soon_threadsafe(self._run_pending)
        except RuntimeError:  # the loop is closed: nothing waits for these calls any more
            with self._lock:
                self._pending.clear()

    def _run_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for fn, args in batch:
            try:
                fn(*args)
            except Exception:  # one connection's bug must not drop the other connections' events
                log.exception("a relayed call failed")


_RELAYS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopRelay] = weakref.WeakKeyDictionary()
_RELAYS_LOCK = threading.Lock()


def relay_for(loop: asyncio.AbstractEventLoop) -> LoopRelay:
    """The relay of ``loop`` (made at the first call; gone with the loop)."""
    with _RELAYS_LOCK:
        relay = _RELAYS.get(loop)
        if relay is None:
            relay = _RELAYS[loop] = LoopRelay(loop)
        return relay
