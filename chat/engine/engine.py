"""The engine: one model, one prefix cache, many concurrent turns, one batched forward per step.

A single worker thread owns the model and the cache. It admits new turns (render, look up, restore) at the start of
each step, then runs one scheduler step (:mod:`chat.engine.scheduler`): a forward over the next token of every
decoding turn and prefill chunks of the turns still prefilling. Callers use :meth:`Engine.generate` (async) or
:meth:`Engine.submit` (callbacks, any thread)::

    engine = Engine(runtime, cache=PrefixCache(device_budget_bytes=...), batch=BatchSettings(max_batch=32))
    async for event in engine.generate(TurnRequest(messages, SamplingParams(max_tokens=64))):
        ...  # Delta, Delta, ..., Done
    engine.close()

Cancelling the consumer of :meth:`generate` (or calling ``handle.cancel()``) stops the turn at the next step; what
was computed is stored, every lease is given back.

**Threads.** PyTorch runs its parallel regions on an OpenMP thread pool that belongs to the thread that calls it. Two
threads with pools of their own (the loading thread and this worker, 2 threads each on 2 cores) make libgomp stop
spinning between regions, and each of the thousands of small regions of a decode step then waits for a wake-up:
steps measured 3x slower (docs/benchmarks.md). So the model's parallel work belongs to the worker alone: give
``threads`` (the worker sets them) and build the engine with :meth:`Engine.load` (the model loads inside the worker),
or keep the constructing thread's own torch work single-threaded.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from cache import CacheStats, PrefixCache
from chat.engine.constraints import GrammarCompiler, GrammarError
from chat.engine.errors import EngineClosedError
from chat.engine.events import Done, Event, TurnRequest
from chat.engine.metrics import Metrics
from chat.engine.recent_replies import RecentReplies
from chat.engine.runtime import ModelRuntime
from chat.engine.scheduler import BatchSettings, Scheduler, priority_of
from chat.engine.turn import Turn
from chat.engine.volatile_lines import VolatileLines

_log = logging.getLogger(__name__)
WAKE = object()  # put in the worker's inbox to make it look at its turns again (a paused turn went on, or ended)
Sink = Callable[[Event | BaseException], None]  # receives every event, then possibly an exception; any thread


@dataclass(eq=False)
class JobHandle:
    turn: Turn
    sink: Sink = field(repr=False)
    wake: Callable[[], None] = field(default=lambda: None, repr=False)  # wakes the engine's worker if it waits
    metrics: Metrics | None = field(default=None, repr=False)  # counts the turn's pauses

    def cancel(self) -> None:
        """Stop at the next step (thread-safe)."""
        self.turn.cancel()
        self.wake()  # a worker waiting while every turn is paused must still end this one

    def pause(self) -> None:
        """Keep the turn out of the steps while it decodes (its client fell behind; see Scheduler, Paused turns)
        until :meth:`resume`. Thread-safe."""
        if not self.turn.paused and self.metrics is not None:
            self.metrics.turn_paused()
        self.turn.pause()

    def resume(self) -> None:
        """Let a paused turn back into the steps. Thread-safe."""
        self.turn.pause(False)
        self.wake()


class QueuedPriorities:
    """The priorities of the turns queued for the worker (submitted from any thread, not yet admitted), and the best
    of them: :attr:`best` is read without a lock (between the layers of a step) and changed only under it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: Counter[int] = Counter()
        self.best = sys.maxsize  # the lowest priority queued; sys.maxsize: none

    def add(self, priority: int) -> None:
        with self._lock:
            self._count[priority] += 1
            self.best = min(self.best, priority)

    def remove(self, priority: int) -> None:
        with self._lock:
            self._count[priority] -= 1
            if self._count[priority] <= 0:
                del self._count[priority]
            self.best = min(self._count, default=sys.maxsize)


class Engine:
    def __init__(
        self,
        runtime: ModelRuntime | None,
        *,
        cache: PrefixCache | None,
        batch: BatchSettings | None = None,
        threads: int | None = None,
        loader: Callable[[], ModelRuntime] | None = None,
        volatile: VolatileLines | None = None,
    ) -> None:
        """An engine over ``runtime``, or over what ``loader`` returns when called in the worker thread (see
        :meth:`load`). ``threads``: torch threads of the worker (None: torch's current setting). ``volatile``: lines
        dropped from every rendered prompt (or, with its ``drop`` off, only named when they cause a miss)."""
        self.runtime = runtime  # the model (used only by the worker thread)
        self.cache = cache  # None: `--no-prefix-cache`
        self.volatile = volatile  # volatile client lines (chat.engine.volatile_lines); None: none known
        self.replies = RecentReplies()  # recent replies per namespace: a turn tells template drift by them
        self.metrics = Metrics()  # counters and histograms for /metrics
        self.batch = batch or BatchSettings()  # what one step may hold
        self._queued = QueuedPriorities()  # of the turns submitted and not yet admitted (steps may yield to them)
        self.scheduler: Scheduler | None = self._scheduler(runtime) if runtime is not None else None
        self.threads = threads  # torch threads of the worker
        self._handles: dict[int, JobHandle] = {}  # id(turn) -> its handle, for active turns
        # new jobs; WAKE wakes the worker to look at its turns again (one went on or was cancelled); None: to exit
        self._inbox: queue.SimpleQueue[JobHandle | object | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # held while the worker touches the cache; stats() takes it too
        self._closed = False
        self._computing: bool | None = None  # what the cache's disk writer was last told (see _computes)
        self._loader = loader  # builds the runtime in the worker, once
        self._ready = threading.Event()  # the runtime is there (or failed to load: _load_error)
        self._load_error: BaseException | None = None
        self._grammars: GrammarCompiler | None = None  # compiles grammars for this model's tokenizer (made once)
        self._grammars_lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="turncache-engine", daemon=True)
        self._worker.start()

    @classmethod
    def load(
        cls,
        loader: Callable[[], ModelRuntime],
        *,
        cache: PrefixCache | None,
        batch: BatchSettings | None = None,
        threads: int | None = None,
        volatile: VolatileLines | None = None,
    ) -> Engine:
        """An engine whose model ``loader()`` loads inside its worker thread (so that only that thread ever runs
        torch in parallel); returns once the model is loaded.

        Raises:
            whatever ``loader`` raised (the worker has then stopped).
        """
        engine = cls(None, cache=cache, batch=batch, threads=threads, loader=loader, volatile=volatile)
        engine._ready.wait()
        if engine._load_error is not None:
            raise engine._load_error
        return engine

    # ---------------------------------------------------------------- API

    def submit(self, request: TurnRequest, sink: Sink) -> JobHandle:
        """Queue a turn; ``sink`` gets its events (from the worker thread). Returns a handle to cancel it.

        Raises:
            EngineClosedError: the engine was closed.
        """
        if self._closed:
            raise EngineClosedError("the engine is shut down")
        spec = request.params.grammar
        grammar = self.grammars().compile(spec) if spec is not None else None
        turn = Turn(
            self.runtime,
            self.cache,
            request,
            draft_tokens=self.batch.draft_tokens,
            grammar=grammar,
            replies=self.replies if self.cache is not None else None,
            volatile=self.volatile,
        )
        handle = JobHandle(turn, sink, self._wake, self.metrics)
        self._queued.add(priority_of(turn))  # before the worker can take it (it removes it on admission)
        self._inbox.put(handle)
        return handle

    async def generate(
        self, request: TurnRequest, *, on_start: Callable[[JobHandle], None] | None = None
    ) -> AsyncIterator[Event]:
        """Stream a turn's events: Delta ... Done. ``on_start`` gets the turn's handle once it is queued (to cancel
        it from elsewhere). Closing the stream before its Done cancels the turn.

        Raises:
            ContextOverflowError, InvalidMediaError: before anything is computed.
            EngineClosedError: the engine was closed.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        handle = self.submit(request, lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
        if on_start is not None:
            on_start(handle)
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

    def grammars(self) -> GrammarCompiler:
        """The compiler of this model's grammars (built at the first call, ~0.4 s for a 49k vocabulary; the worker
        builds it once the model is loaded). Thread-safe.

        Raises:
            GrammarError: the model offers no tokenizer for constrained decoding.
        """
        with self._grammars_lock:
            if self._grammars is None:
                make = getattr(self.runtime, "constraint_tokenizer", None)
                if make is None:
                    raise GrammarError(f"the model {getattr(self.runtime, 'name', '?')!r} has no constrained decoding")
                self._grammars = GrammarCompiler(make())
            return self._grammars

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

    def _run(self) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        if self._loader is not None:
            try:
                self.runtime = self._loader()
                self.scheduler = self._scheduler(self.runtime)
            except BaseException as exc:  # reported by load(); nothing else runs
                self._load_error = exc
                self._closed = True
                self._ready.set()
                return
        try:
            self.grammars()  # the tokenizer table for grammars, before the first request needs it
        except Exception:  # constrained turns are then refused, nothing else changes
            _log.warning("constrained decoding is unavailable for this model", exc_info=True)
        self._ready.set()
        self._loop()

    def _wake(self) -> None:
        """Make a worker that waits for work look at its turns again (any thread). Cheap: one queue put."""
        self._inbox.put(WAKE)

    def _loop(self) -> None:
        assert self.scheduler is not None
        while self._admit_waiting():
            if not self.scheduler.ready:
                continue
            self._computes(True)
            with self._lock:
                results = self.scheduler.step()
            self.metrics.step_done(self.scheduler.last)
            for turn, events in results:
                self._deliver(turn, events)
        with self._lock:
            results = self.scheduler.stop_all()
        for turn, events in results:
            self._deliver(turn, events)
        while True:  # jobs queued after close
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, JobHandle):
                self._queued.remove(priority_of(job.turn))
                job.sink(EngineClosedError("the engine is shut down"))

    def _admit_waiting(self) -> bool:
        """Begin every queued turn (waiting for one, or for a wake-up, while no step would do anything: nothing is
        active, or every active turn is paused). False once the engine is closing."""
        while True:
            assert self.scheduler is not None
            try:
                if self.scheduler.ready:
                    job = self._inbox.get_nowait()
                else:
                    self._computes(False)
                    job = self._inbox.get()
            except queue.Empty:
                return True
            if job is None:
                return False
            if isinstance(job, JobHandle):
                self._computes(True)
                self._admit(job)

    def _computes(self, busy: bool) -> None:
        """Tell the prefix cache's disk writer whether this worker has turns to compute: its writes wait while it
        does (a little, bounded: cache.disk), so that files are written behind the turns, not through them."""
        if busy != self._computing and self.cache is not None:
            self._computing = busy
            self.cache.defer_disk_writes(busy)

    def _admit(self, job: JobHandle) -> None:
        self._queued.remove(priority_of(job.turn))
        try:
            with self._lock:
                job.turn.begin()
        except Exception as exc:  # a typed engine error, a bug or a broken model: report it to this caller only
            job.sink(exc)
            return
        self.metrics.turn_started()
        self._handles[id(job.turn)] = job
        self.scheduler.add(job.turn)

    def _scheduler(self, runtime: ModelRuntime) -> Scheduler:
        """The scheduler of ``runtime``'s turns; its steps may yield to better turns queued here (see Yielding)."""
        return Scheduler(runtime, self.batch, waiting=lambda: self._queued.best)

    def _deliver(self, turn: Turn, events: list[Event]) -> None:
        job = self._handles[id(turn)]
        for event in events:
            if isinstance(event, Done):
                self.metrics.turn_done(event)
                del self._handles[id(turn)]
            job.sink(event)
