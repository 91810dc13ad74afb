"""The engine: one model, one prefix cache, many concurrent turns.

A single worker thread owns the model and the cache. It takes turns round-robin, one step each (a prefill chunk or
one decoded token), so a turn that arrives while another session streams a long reply waits at most one step per
active turn before its own prefill starts. Callers use :meth:`Engine.generate` (async) or :meth:`Engine.submit`
(callbacks, any thread)::

    engine = Engine(runtime, cache=PrefixCache(device_budget_bytes=...))
    async for event in engine.generate(TurnRequest(messages, SamplingParams(max_tokens=64))):
        ...  # Delta, Delta, ..., Done
    engine.close()

Cancelling the consumer of :meth:`generate` (or calling ``handle.cancel()``) stops the generation at its next step;
what was computed is stored, every lease is given back.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from cache import CacheStats, PrefixCache
from chat.engine.errors import EngineClosedError, EngineError
from chat.engine.generation import Done, Event, Generation, TurnRequest
from chat.engine.metrics import Metrics
from chat.engine.runtime import ModelRuntime

Sink = Callable[[Event | BaseException], None]  # receives every event, then possibly an exception; any thread


@dataclass(eq=False)
class JobHandle:
    generation: Generation
    sink: Sink = field(repr=False)

    def cancel(self) -> None:
        """Stop at the next step (thread-safe)."""
        self.generation.cancel()


class Engine:
    def __init__(self, runtime: ModelRuntime, *, cache: PrefixCache | None) -> None:
        self.runtime = runtime  # the model (used only by the worker thread)
        self.cache = cache  # None: `--no-prefix-cache`
        self.metrics = Metrics()  # counters and histograms for /metrics
        self._inbox: queue.SimpleQueue[JobHandle | None] = queue.SimpleQueue()  # new jobs; None wakes to exit
        self._lock = threading.Lock()  # held while the worker touches the cache; stats() takes it too
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="turncache-engine", daemon=True)
        self._worker.start()

    # ---------------------------------------------------------------- API

    def submit(self, request: TurnRequest, sink: Sink) -> JobHandle:
        """Queue a turn; ``sink`` gets its events (from the worker thread). Returns a handle to cancel it.

        Raises:
            EngineClosedError: the engine was closed.
        """
        if self._closed:
            raise EngineClosedError("the engine is shut down")
        handle = JobHandle(Generation(self.runtime, self.cache, request), sink)
        self._inbox.put(handle)
        return handle

    async def generate(self, request: TurnRequest) -> AsyncIterator[Event]:
        """Stream a turn's events: Delta ... Done.

        Raises:
            ContextOverflowError: before anything is computed.
            EngineClosedError: the engine was closed.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        handle = self.submit(request, lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
        finished = False
        try:
            while True:
                item = await events.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if isinstance(item, Done):
                    finished = True
                    return
        finally:
            if not finished:
                handle.cancel()  # the consumer went away: stop within one step

    def cache_stats(self) -> CacheStats | None:
        if self.cache is None:
            return None
        with self._lock:
            return self.cache.stats()

    def active_turns(self) -> int:
        return self.metrics.active

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is running, stop the worker thread."""
        self._closed = True
        self._inbox.put(None)
        self._worker.join(timeout)

    # ---------------------------------------------------------------- worker

    def _loop(self) -> None:
        active: deque[JobHandle] = deque()
        while True:
            try:
                job = self._inbox.get() if not active else self._inbox.get_nowait()
            except queue.Empty:
                job = False  # nothing new
            if job is None:
                break
            if job:
                self._start(job, active)
                continue  # take every waiting job before the next step
            current = active.popleft()
            with self._lock:
                events = current.generation.step()
            self._deliver(current, events)
            if not current.generation.done:
                active.append(current)
        for job in active:
            with self._lock:
                events = job.generation.stop_now()
            self._deliver(job, events)
        while True:  # jobs queued after close
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.sink(EngineClosedError("the engine is shut down"))

    def _start(self, job: JobHandle, active: deque[JobHandle]) -> None:
        try:
            with self._lock:
                job.generation.begin()
        except EngineError as exc:
            job.sink(exc)
            return
        except Exception as exc:  # a bug or a broken model: report it to this caller only
            job.sink(exc)
            return
        self.metrics.turn_started()
        active.append(job)

    def _deliver(self, job: JobHandle, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Done):
                self.metrics.turn_done(event)
            job.sink(event)
