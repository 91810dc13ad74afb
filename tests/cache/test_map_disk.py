"""cache.map_disk, the map's side of the disk tier: the files of earlier runs adopted per namespace and read on first
use, an entry that leaves memory kept on disk (served from the write queue meanwhile) or dropped while writes fail,
and files of another layout dropped at the namespace's first insert."""

from __future__ import annotations

import errno
import os
import threading

import pytest
import torch

import cache.disk
from cache import DISK, NormalKV
from tests.cache.disk_helpers import (  # close_caches: an autouse fixture
    NS,
    close_caches,  # noqa: F401
    conversation,
    failing_writes,
    open_cache,
    restart,
)
from tests.cache.helpers import nbytes, normal


def test_tensors_are_read_only_on_first_use_after_a_restart(tmp_path):
    before = open_cache(tmp_path)
    for first in (1, 2, 3):
        before.insert(NS, [first, *conversation(9)], [normal(10)])
    after = restart(before, tmp_path)
    assert after.lookup(NS, [9, 9]) is None  # the namespace adopts its three files: indexed, nothing read
    stats = after.stats()
    assert stats.entries_per_tier[DISK] == 3 and stats.disk_reads == 0
    assert stats.bytes_per_tier["device"] == 0 and stats.bytes_per_tier[DISK] == 3 * nbytes([normal(10)])
    after.lookup(NS, [2, *conversation(9), 5])
    assert after.stats().disk_reads == 1 and after.stats().entries_per_tier[DISK] == 2
    after.check_invariants()


def test_a_file_whose_layers_do_not_fit_the_model_is_dropped_at_the_first_insert(tmp_path, caplog):
    before = open_cache(tmp_path)
    before.insert(NS, conversation(6), [normal(6)])
    after = restart(before, tmp_path)
    wide = torch.zeros(1, 2, 7, 2)  # another head count: another layout for the same namespace
    after.insert(NS, [9, *conversation(6)], [NormalKV(wide, wide.clone())])
    assert after.stats().entries == 1 and "do not fit the model" in caplog.text
    after.check_invariants()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_disk_that_refuses_writes_leaves_the_cache_serving_from_memory(tmp_path, monkeypatch, caplog, code):
    real_write = cache.disk.write_file
    failing_writes(monkeypatch, OSError(code, os.strerror(code)))
    c = open_cache(tmp_path, device_budget_bytes=nbytes([normal(8)]), host_budget_bytes=0)
    first = c.insert(NS, [1, *conversation(7)], [normal(8)])
    assert not c.flush(timeout=10) or c.stats().disk_write_errors >= 1
    second = c.insert(NS, [2, *conversation(7)], [normal(8)])  # pushes the first out of memory: it has no file, and
    # none is tried while writes fail
    c.flush(timeout=10)
    stats = c.stats()
    assert stats.disk_healthy is False and stats.disk_write_errors == 2
    assert c.entry_ids() == [second] and first not in c.entry_ids() and stats.evictions == 1
    assert c.lookup(NS, [2, *conversation(7), 5]).length == 8  # served from memory
    assert caplog.text.count("cannot write to") == 1  # said once, not once per write
    monkeypatch.setattr(cache.disk, "write_file", real_write)
    c.insert(NS, [3, *conversation(7)], [normal(8)])
    c.flush(timeout=10)
    assert c.stats().disk_healthy is True and "work again" in caplog.text
    c.close()


def test_an_entry_that_leaves_memory_before_its_file_is_written_is_served_from_the_queue(tmp_path, monkeypatch):
    real_write = cache.disk.write_file
    gate = threading.Event()

    def gated(*args, **kwargs):
        gate.wait(10)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(cache.disk, "write_file", gated)
    c = open_cache(tmp_path, device_budget_bytes=nbytes([normal(8)]), host_budget_bytes=0)
    first = c.insert(NS, [1, *conversation(7)], [normal(8)])
    c.insert(NS, [2, *conversation(7)], [normal(8)])
    assert c.entry_tier(first) == DISK and c.stats().disk_pending == 2
    lease = c.acquire(c.lookup(NS, [1, *conversation(7), 5]), NS)
    assert torch.equal(lease.layers[0].keys, normal(8).keys) and c.stats().disk_reads == 0
    c.release(lease)
    gate.set()
    assert c.close(timeout=10)
