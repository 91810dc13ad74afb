"""The disk tier: what survives a restart, exactly; bad files are skipped, never served; a full or read-only disk
leaves the cache serving from memory."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch

import cache.disk
from cache import DISK, Namespace, PrefixCache
from tests.cache.disk_helpers import (  # close_caches: an autouse fixture
    NS,
    GiB,
    close_caches,  # noqa: F401
    conversation,
    open_cache,
    restart,
)
from tests.cache.helpers import image, nbytes, normal, recurrent, rotating, stateless

OTHER_TENANT = Namespace("model-a", "float32", salt="another-salt")
MROPE = ((0, 0), (6, -3))  # the shape of a multimodal adapter's extras: (length, next position - length) steps


def files(path: Path, kind: str) -> list[Path]:
    return sorted((path / "v1" / kind).glob("*.safetensors"))


def mixed_layers(n: int):
    """One layer of every kind: normal, rotating with a margin, recurrent snapshots, stateless."""
    return [normal(n, fill=0.5), rotating(n, window=4, rows=min(n, 6)), recurrent({3, 6, n}), stateless()]


def same_state(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if hasattr(a, "keys") and hasattr(a, "values") and not isinstance(a.keys, dict):
        return torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and vars_of(a) == vars_of(b)
    if hasattr(a, "tensors"):
        return a.length == b.length and all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    return a == b


def vars_of(state) -> tuple:
    return tuple(getattr(state, k, None) for k in ("window", "seen"))


# -- what survives a restart


def test_every_layer_kind_media_and_extras_come_back_exactly_after_a_restart(tmp_path):
    tokens = [*conversation(6), 50, 50, 50, *conversation(5)]  # an image at [6, 9)
    media = [image(6, 9, "sha256-of-the-picture")]
    before = open_cache(tmp_path)
    before.insert(NS, tokens, mixed_layers(14), media=media, extras=MROPE)
    expected = before.acquire(before.lookup(NS, [*tokens, 99], media), NS)

    after = restart(before, tmp_path)
    match = after.lookup(NS, [*tokens, 99], media)
    assert match is not None and match.length == 14
    lease = after.acquire(match, NS)
    assert all(same_state(a, b) for a, b in zip(lease.layers, expected.layers, strict=True))
    assert (lease.extra, lease.extras_upto, lease.media) == (expected.extra, expected.extras_upto, expected.media)
    assert [None if s is None else sorted(s) for s in lease.snapshots_upto] == [None, None, [3, 6, 14], None]
    assert lease.extras_upto == MROPE and type(lease.extras_upto[1][1]) is int
    after.release(lease)
    after.check_invariants()


def test_shorter_prefixes_and_recurrent_snapshots_are_served_after_a_restart(tmp_path):
    tokens = conversation(14)
    before = open_cache(tmp_path)
    before.insert(NS, tokens, [normal(14), recurrent({3, 6, 14})])
    after = restart(before, tmp_path)
    match = after.lookup(NS, [*tokens[:6], 77, 78])  # an edit after 6 tokens: the snapshot at 6 serves
    assert match.length == 6
    lease = after.acquire(match, NS)
    assert lease.layers[1].length == 6 and torch.equal(lease.layers[1].tensors[0], recurrent({6}).snapshots[6][0])
    after.release(lease)


def test_extras_values_round_trip_with_their_types(tmp_path):
    extras = ((0, None), (1, (1, 2)), (2, [3, (4.5, "x")]), (3, float("inf")), (4, True), (5, 2**70))
    before = open_cache(tmp_path)
    before.insert(NS, conversation(8), [normal(8)], extras=extras)
    after = restart(before, tmp_path)
    lease = after.acquire(after.lookup(NS, [*conversation(8), 1]), NS)
    assert lease.extras_upto == extras
    assert [type(v) for _, v in lease.extras_upto] == [type(v) for _, v in extras]


def test_an_entry_whose_extras_cannot_be_stored_stays_in_memory_only(tmp_path, caplog):
    cache = open_cache(tmp_path)
    eid = cache.insert(NS, conversation(5), [normal(5)], extras=[(0, {"a": 1})])
    assert not cache.entry_has_file(eid) and "memory only" in caplog.text
    assert cache.lookup(NS, [*conversation(5), 1]).length == 5
    cache.close()


def test_another_namespace_finds_nothing_and_no_file_holds_the_salt(tmp_path):
    before = open_cache(tmp_path)
    before.insert(NS, conversation(10), [normal(10)])
    after = restart(before, tmp_path)
    for other in (OTHER_TENANT, Namespace("model-b", "float32", salt=NS.salt), Namespace("model-a", "bfloat16")):
        assert after.lookup(other, [*conversation(10), 1]) is None
    assert after.lookup(NS, [*conversation(10), 1]).length == 10
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert NS.salt.encode() not in path.read_bytes()


def test_a_conversation_shares_chunk_files_and_keeps_one_entry_file(tmp_path):
    cache = open_cache(tmp_path)
    tokens: list[int] = []
    for turn in range(5):
        tokens = tokens + conversation(3 + turn)
        lease = cache.acquire(cache.lookup(NS, tokens), NS) if turn else None
        cache.insert(NS, tokens, [normal(len(tokens))])
        if lease:
            cache.release(lease)
    assert cache.flush(timeout=10)
    assert len(files(tmp_path, "entries")) == 1  # superseded entries' files were deleted
    assert len(files(tmp_path, "chunks")) == len(tokens) // 4  # full chunks only, each written once
    cache.close()


def test_a_killed_writer_leaves_nothing_that_a_restart_trips_on(tmp_path):
    cache = open_cache(tmp_path)
    cache.insert(NS, conversation(9), [normal(9)])
    assert cache.close(timeout=10)  # then what a process killed in the middle of writes leaves:
    (tmp_path / "v1" / "entries" / ".half-written.1234.tmp").write_bytes(b"partial")
    orphan = tmp_path / "v1" / "chunks" / ("0" * 32 + ".safetensors")
    orphan.write_bytes(b"a chunk whose entry was never written")
    after = open_cache(tmp_path)
    assert not (tmp_path / "v1" / "entries" / ".half-written.1234.tmp").exists() and not orphan.exists()
    assert after.lookup(NS, [*conversation(9), 1]).length == 9


def test_the_budget_of_a_restart_drops_the_oldest_files_first(tmp_path):
    before = open_cache(tmp_path)
    for first in (1, 2, 3):
        before.insert(NS, [first, *conversation(7)], [normal(8)])
        before.flush(timeout=10)
        time.sleep(0.02)  # distinct modification times
    after = restart(before, tmp_path, disk_budget_bytes=2 * nbytes([normal(8)]))
    assert after.lookup(NS, [1, *conversation(7), 5]) is None
    assert after.lookup(NS, [3, *conversation(7), 5]).length == 8
    after.close()
    assert len(files(tmp_path, "entries")) == 2


# -- bad files: skipped with a warning, never served, never a crash


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("which", ["entries", "chunks"])
def test_a_corrupt_file_is_not_served(tmp_path, caplog, which):
    before = open_cache(tmp_path)
    before.insert(NS, conversation(10), [normal(10)])
    after = restart(before, tmp_path)
    flip_last_byte(files(tmp_path, which)[0])
    with caplog.at_level(logging.WARNING):
        assert after.lookup(NS, [*conversation(10), 1]) is None
    assert "checksum mismatch" in caplog.text
    assert after.stats().disk_read_errors == 1 and after.stats().entries == 0
    after.check_invariants()


def test_a_truncated_file_is_skipped_at_startup(tmp_path, caplog):
    before = open_cache(tmp_path)
    before.insert(NS, conversation(10), [normal(10)])
    before.close()
    path = files(tmp_path, "entries")[0]
    path.write_bytes(path.read_bytes()[:-20])
    with caplog.at_level(logging.WARNING):
        after = open_cache(tmp_path)
    assert f"skipping {path}" in caplog.text and after.stats().disk_skipped_files == 1
    assert after.lookup(NS, [*conversation(10), 1]) is None


def test_swapped_entry_files_are_skipped(tmp_path, caplog):
    before = open_cache(tmp_path)
    before.insert(NS, [1, *conversation(6)], [normal(7)])
    before.insert(NS, [2, *conversation(6)], [normal(7)])
    before.close()
    a, b = files(tmp_path, "entries")
    a.rename(a.with_suffix(".tmp-swap"))
    b.rename(a)
    a.with_suffix(".tmp-swap").rename(b)
    after = open_cache(tmp_path)
    assert after.stats().disk_skipped_files == 2 and "does not match its content" in caplog.text
    assert after.lookup(NS, [1, *conversation(6), 5]) is None and after.lookup(NS, [2, *conversation(6), 5]) is None


def test_swapped_chunk_files_are_not_served(tmp_path, caplog):
    before = open_cache(tmp_path)
    before.insert(NS, conversation(12), [normal(12)])  # three chunks of 4
    after = restart(before, tmp_path)
    a, b = files(tmp_path, "chunks")[:2]
    data_a = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data_a)
    assert after.lookup(NS, [*conversation(12), 1]) is None
    assert "swapped" in caplog.text and after.stats().disk_read_errors == 1


def test_foreign_and_garbage_files_are_skipped_and_left_alone(tmp_path, caplog):
    from safetensors.torch import save_file

    cache = open_cache(tmp_path)
    cache.insert(NS, conversation(6), [normal(6)])
    cache.close()
    entries = tmp_path / "v1" / "entries"
    save_file(
        {"x": torch.zeros(2)},
        str(entries / "future.safetensors"),
        metadata={"format": "turncache-prefix-entry", "version": "99"},
    )
    (entries / "garbage.safetensors").write_bytes(os.urandom(300))
    after = open_cache(tmp_path)
    assert after.stats().disk_skipped_files == 2 and "foreign file" in caplog.text
    assert (entries / "future.safetensors").exists() and (entries / "garbage.safetensors").exists()
    assert after.lookup(NS, [*conversation(6), 1]).length == 6


# -- a full or read-only disk: serve from memory, say so


def test_a_read_only_cache_directory(tmp_path, caplog):
    c = open_cache(tmp_path)
    undo = make_read_only(tmp_path / "v1" / "entries")
    try:
        c.insert(NS, conversation(6), [normal(6)])
        c.flush(timeout=10)
        assert c.stats().disk_healthy is False and c.stats().disk_write_errors == 1
        assert c.lookup(NS, [*conversation(6), 1]).length == 6
    finally:
        undo()
    c.close()


def make_read_only(path: Path):
    """Make ``path`` refuse new files, even for root (``chattr +i``); returns the undo. Skips when impossible."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return lambda: path.chmod(0o755)
    import subprocess

    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a directory read-only for root here (no chattr)")
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_second_process_on_the_same_directory_gets_no_disk_tier(tmp_path, caplog):
    first = open_cache(tmp_path)
    second = open_cache(tmp_path)  # another open file description: the same as another process
    assert "another process uses it" in caplog.text
    assert first.stats().disk_healthy is True and second.stats().disk_healthy is False
    first.close()
    assert open_cache(tmp_path).stats().disk_healthy is True  # the lock went with the close


def test_an_unusable_cache_directory_turns_the_disk_tier_off(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    c = open_cache(blocker / "cache")
    assert "disk tier off" in caplog.text and c.stats().disk_healthy is False
    c.insert(NS, conversation(6), [normal(6)])
    assert c.lookup(NS, [*conversation(6), 1]).length == 6 and not c.entry_has_file(c.entry_ids()[0])
    assert c.close(timeout=1) is True


def test_close_returns_within_its_timeout_when_the_disk_is_slow(tmp_path, monkeypatch, caplog):
    real_write = cache.disk.write_file

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(cache.disk, "write_file", slow)
    c = open_cache(tmp_path)
    for first in range(6):
        c.insert(NS, [first, *conversation(5)], [normal(6)])
    t = time.monotonic()
    assert c.close(timeout=0.6) is False
    assert time.monotonic() - t < 1.5 and "still queued at shutdown" in caplog.text


def test_a_lookup_that_reads_an_entry_back_keeps_an_idle_entry_host_memory_can_hold(tmp_path):
    """Found by the property test (seed 12785255949245291216207987224353160150): the lookup reads disk-only entry 2
    back into the device tier. Enforcing the budgets there used to treat it as idle (it is not acquired yet) and
    move it to the host tier, which pushed idle entry 3 (no file: the disk budget is full with entry 2's) out of
    memory, so it was dropped; the acquire then moved entry 2 to the device tier and host memory was left empty.
    The lookup now spares the entry it read back."""
    ns = Namespace("m", "float32")
    cache = open_cache(
        tmp_path, device_budget_bytes=48, host_budget_bytes=72, disk_budget_bytes=72, disk_chunk_tokens=2
    )
    cache.insert(ns, [1, 1], [recurrent({2}), normal(2)])
    held = cache.insert(ns, [1, 1, 1], [recurrent({2, 3}), normal(3)])
    lease = cache.acquire(cache.lookup(ns, [1, 1, 1]), ns)
    idle = cache.insert(ns, [1], [recurrent({1}), normal(1)])
    cache.release(lease)
    assert cache.entry_tier(held) == DISK and cache.entry_tier(idle) == "host" and not cache.entry_has_file(idle)
    cache.acquire(cache.lookup(ns, [1, 1, 1]), ns)
    assert idle in cache.entry_ids(), "the idle entry was dropped although host memory had room for it"
    assert cache.entry_tier(held) == "device" and cache.entry_tier(idle) == "host" and cache.stats().evictions == 0


# -- written behind the engine (issue 37)


def wait_until(predicate, timeout: float = 10.0) -> float:
    """Seconds until ``predicate()`` held (polled every 10 ms); fails the test after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_write_waits_its_delay_and_an_entry_superseded_meanwhile_is_never_written(tmp_path):
    c = open_cache(tmp_path, disk_write_delay_s=0.4)
    c.insert(NS, conversation(6), [normal(6)])
    c.insert(NS, conversation(10), [normal(10)])  # the next turn: supersedes the first entry
    time.sleep(0.2)
    assert files(tmp_path, "entries") == [] and c.stats().disk_pending >= 1  # nothing written within the delay
    wait_until(lambda: c.stats().disk_pending == 0)
    assert len(files(tmp_path, "entries")) == 1 and c.stats().disk_writes == 1  # the superseded one was skipped
    restarted = restart(c, tmp_path)
    assert restarted.lookup(NS, [*conversation(10), 3]).length == 10


def test_due_writes_wait_while_the_engine_computes_and_go_once_it_has_been_idle_a_moment(tmp_path):
    c = open_cache(tmp_path, disk_write_delay_s=0.0, disk_write_defer_s=60.0)
    c.defer_disk_writes(True)
    c.insert(NS, conversation(6), [normal(6)])
    time.sleep(0.5)
    assert c.stats().disk_pending == 1 and files(tmp_path, "entries") == []
    c.defer_disk_writes(False)
    waited = wait_until(lambda: c.stats().disk_pending == 0)
    assert waited >= cache.disk.QUIET_S * 0.9 and len(files(tmp_path, "entries")) == 1


def test_a_write_deleted_while_the_engine_computes_is_skipped_once_it_stops(tmp_path):
    c = open_cache(tmp_path, disk_write_delay_s=0.0, disk_write_defer_s=60.0)
    c.defer_disk_writes(True)
    c.insert(NS, conversation(6), [normal(6)])
    c.insert(NS, conversation(10), [normal(10)])  # supersedes the first
    time.sleep(0.3)
    assert c.stats().disk_pending >= 1 and files(tmp_path, "entries") == []  # the writer sleeps while it computes
    c.defer_disk_writes(False)
    wait_until(lambda: c.stats().disk_pending == 0)
    assert len(files(tmp_path, "entries")) == 1 and c.stats().disk_writes == 1


def test_a_busy_engine_holds_a_write_back_at_most_the_defer_bound(tmp_path):
    c = open_cache(tmp_path, disk_write_delay_s=0.0, disk_write_defer_s=0.5)
    c.defer_disk_writes(True)
    c.insert(NS, conversation(6), [normal(6)])
    waited = wait_until(lambda: c.stats().disk_pending == 0)
    assert 0.4 <= waited < 5 and len(files(tmp_path, "entries")) == 1  # written although the engine never idled


def test_a_flush_writes_at_once_whatever_the_delay_and_the_engine(tmp_path):
    c = open_cache(tmp_path, disk_write_delay_s=60.0, disk_write_defer_s=60.0)
    c.defer_disk_writes(True)
    c.insert(NS, conversation(6), [normal(6)])
    start = time.monotonic()
    assert c.flush(timeout=10) and time.monotonic() - start < 5
    assert len(files(tmp_path, "entries")) == 1
    restarted = restart(c, tmp_path)
    assert restarted.lookup(NS, [*conversation(6), 3]).length == 6


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priorities here")
def test_the_writer_thread_runs_at_the_lowest_scheduling_priority(tmp_path):
    c = open_cache(tmp_path)
    c.insert(NS, conversation(6), [normal(6)])
    assert c.flush(timeout=10)
    (writer,) = [t for t in threading.enumerate() if t.name == "turncache-disk" and t.native_id is not None][-1:]
    assert os.getpriority(os.PRIO_PROCESS, writer.native_id) == cache.disk.WRITER_NICE


def test_the_write_timings_must_be_finite_non_negative_numbers(tmp_path):
    from cache import LengthError

    for bad in (-1.0, float("inf"), "1", True):
        with pytest.raises(LengthError):
            PrefixCache(disk_dir=tmp_path, disk_budget_bytes=GiB, disk_write_delay_s=bad)
        with pytest.raises(LengthError):
            PrefixCache(disk_dir=tmp_path, disk_budget_bytes=GiB, disk_write_defer_s=bad)
