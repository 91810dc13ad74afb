"""Shared by the disk-tier tests (test_disk, test_map_disk): caches on a directory, closed after each test (import
`close_caches`, an autouse fixture), restarts, and a conversation's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

import cache.disk
from cache import Namespace, PrefixCache

NS = Namespace("model-a", "float32", salt="tenant-secret-salt")


GiB = 2**30


OPENED: list[PrefixCache] = []


@pytest.fixture(autouse=True)
def close_caches():
    """Every cache a test opened is closed after it, so that no writer thread outlives its test."""
    yield
    while OPENED:
        OPENED.pop().close(timeout=10)


def open_cache(path: Path, **kw) -> PrefixCache:
    kw.setdefault("disk_budget_bytes", GiB)
    kw.setdefault("disk_chunk_tokens", 4)
    cache = PrefixCache(disk_dir=path, **kw)
    OPENED.append(cache)
    return cache


def restart(cache: PrefixCache, path: Path, **kw) -> PrefixCache:
    assert cache.close(timeout=10)
    return open_cache(path, **kw)


def conversation(n: int) -> list[int]:
    return [1 + (i * 7) % 50 for i in range(n)]


def failing_writes(monkeypatch, error: OSError) -> list[int]:
    calls: list[int] = []

    def fail(*args, **kwargs):
        calls.append(1)
        raise error

    monkeypatch.setattr(cache.disk, "write_file", fail)
    return calls
