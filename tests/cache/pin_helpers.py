"""Shared by the pin tests (test_pins, test_map_pins): two tenants, entries of one normal layer of ``E`` bytes per 4
tokens, fresh token runs, and a clock stepped by hand (nothing sleeps)."""

from __future__ import annotations

from cache import Namespace, PrefixCache
from tests.cache.helpers import nbytes, normal

A = Namespace("model-a", "float32", salt="tenant-a")


B = Namespace("model-a", "float32", salt="tenant-b")


E = nbytes([normal(4)])  # bytes of a 4-token entry


_fresh = iter(range(1_000, 10**7, 100))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def fresh(n: int = 4) -> list[int]:
    start = next(_fresh)
    return list(range(start, start + n))


def put(cache: PrefixCache, ns: Namespace, tokens: list[int]) -> int:
    return cache.insert(ns, tokens, [normal(len(tokens))])


def flood(cache: PrefixCache, ns: Namespace, entries: int) -> None:
    for _ in range(entries):
        put(cache, ns, fresh())


def restorable(cache: PrefixCache, ns: Namespace, tokens: list[int]) -> int:
    """The cached length a lookup of ``tokens`` + one more token finds (0: none)."""
    match = cache.lookup(ns, [*tokens, 7])
    return 0 if match is None else match.length
