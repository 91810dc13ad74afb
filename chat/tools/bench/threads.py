"""Where a benchmark runs torch, and with how many threads.

PyTorch's parallel regions run on an OpenMP pool that belongs to the calling thread, and two threads that each keep a
pool (the benchmark's and an engine's worker, 2 threads each on 2 cores) make every parallel region of both wait for
a wake-up instead of a spin: an engine step measured 3x slower (chat.engine.engine). So a benchmark that drives an
:class:`~chat.engine.engine.Engine` keeps its own thread single-threaded (:func:`leave_parallelism_to_engines`) and
gives each engine :func:`engine_threads`; work that must run in parallel outside an engine (loading a model, stock
``generate``) runs in a thread of its own that ends with it (:func:`in_fresh_thread`), taking its pool along.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def engine_threads() -> int:
    """Torch threads an engine's worker gets: every core."""
    return os.cpu_count() or 1


def leave_parallelism_to_engines() -> None:
    """Make the calling thread's own torch work single-threaded (it then keeps no OpenMP pool)."""
    import torch

    torch.set_num_threads(1)


def in_fresh_thread(fn: Callable[[], T], threads: int | None = None) -> T:
    """``fn()`` in a new thread with ``threads`` torch threads (default: :func:`engine_threads`); its result, or
    its exception re-raised here. The thread, and its OpenMP pool, are gone when this returns."""
    box: dict[str, object] = {}

    def body() -> None:
        import torch

        torch.set_num_threads(threads or engine_threads())
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=body, name="turncache-bench-torch")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
