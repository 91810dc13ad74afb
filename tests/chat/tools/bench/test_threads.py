"""chat/tools/bench/threads.py: a benchmark's own thread single-threaded, parallel work in a thread of its own."""

import os
import threading

import pytest
import torch

from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines


@pytest.fixture(autouse=True)
def _one_thread_after():
    yield
    torch.set_num_threads(1)


def test_an_engine_gets_every_core():
    assert engine_threads() == (os.cpu_count() or 1)


def test_work_runs_in_a_new_thread_that_ends_with_it_and_has_the_torch_threads_asked_for():
    torch.set_num_threads(1)
    seen = in_fresh_thread(lambda: (threading.current_thread(), torch.get_num_threads()), threads=3)
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()  # ended with the work
    assert seen[1] == 3


def test_the_default_is_the_engines_count():
    assert in_fresh_thread(torch.get_num_threads) == engine_threads()


def test_an_exception_in_the_work_is_raised_in_the_caller():
    def fails():
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        in_fresh_thread(fails, threads=1)


def test_the_benchmarks_own_thread_is_left_single_threaded():
    torch.set_num_threads(2)
    leave_parallelism_to_engines()
    assert torch.get_num_threads() == 1
