"""chat.models.memory: the process's resident size, and the collection and ``malloc_trim`` that end a model load.

Not tested: that trimming actually lowers the resident size. How much glibc gives back depends on how the heap is
fragmented and on every other thread's arenas, so an assert on it would be flaky; the tests check the calls instead.
"""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from chat.models import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_resident_size_counts_memory_the_process_touches():
    before = memory.resident_mib()
    block = bytearray(64 * 1024 * 1024)  # zero-filled: every page written, so resident
    after = memory.resident_mib()
    assert before > 0
    assert after - before >= 48  # 64 MiB touched; a margin for pages already free in the heap
    del block


def test_resident_size_is_zero_without_proc(monkeypatch):
    class NoProc:
        def __init__(self, *_):
            pass

        def read_text(self):
            raise FileNotFoundError("/proc/self/status")

    monkeypatch.setattr(memory, "Path", NoProc)
    assert memory.resident_mib() == 0.0


class _Cycle:
    def __init__(self):
        self.me = self


def test_release_collects_cycles_then_trims_the_heap(monkeypatch):
    calls = []
    cycle = _Cycle()
    alive = weakref.ref(cycle)

    def trim(pad):
        calls.append((pad, alive() is None))  # the cycle is gone before the heap is trimmed
        return 1

    monkeypatch.setattr(memory, "_trim", lambda: trim)
    del cycle
    gc.disable()  # only release_free_memory's own collection may free the cycle
    try:
        memory.release_free_memory()
    finally:
        gc.enable()
    assert calls == [(0, True)]


def test_release_without_glibc_only_collects(monkeypatch):
    monkeypatch.setattr(memory, "_trim", lambda: None)
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    del cycle
    gc.disable()
    try:
        memory.release_free_memory()
    finally:
        gc.enable()
    assert alive() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_the_trim_is_glibcs_malloc_trim_and_returns_sanely():
    trim = memory._trim()
    if trim is None:
        pytest.skip("no glibc (musl?)")
    assert trim.__name__ == "malloc_trim"
    assert trim(0) in (0, 1)  # 1: memory was given back, 0: none could be
    memory.release_free_memory()  # the real call, end to end
