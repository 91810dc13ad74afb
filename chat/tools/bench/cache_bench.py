"""`turncache bench cache`: the prefix cache on its own, measured in one run.

Figures (all from this run, side by side):

- ``lookup_p99_ms``: p99 latency of ``PrefixCache.lookup`` over ``entries`` entries of ~2,000 tokens that share
  prefixes the way chat does (system prompts shared by many conversations; conversations branching at turn
  boundaries by edits and regenerations);
- ``linear_p99_ms``: the same queries answered by a linear scan over the same entries (what mistral.rs's
  ``PrefixCacheManagerV2`` does: common prefix per entry, then validity), using C-speed slice compares;
- ``lookup_speedup``: ``linear_p99_ms / lookup_p99_ms``;
- ``materialize_ms_4k``: median time to acquire (restore) and release a 4,096-token full-attention entry shaped
  like SmolLM2-135M (30 layers, 3 KV heads, head_dim 64, float32);
- ``conversation_bytes_ratio``: bytes the cache holds after a 20-turn conversation stored the way the engine stores
  it (an entry at the end of every prompt and of every reply, restored from the previous turn) / bytes of the
  final conversation's K/V;
- ``disk_write_ms_4k``: median time from inserting that 4,096-token entry into a cache with a disk tier to its files
  being written (``flush``; the writer thread does the work, the inserting thread only queues it), with
  ``disk_entry_mib`` its size on disk;
- ``disk_read_ms_4k``: median time of the lookup that reads that entry back after a restart (a new cache on the same
  directory: entry file and chunk files read, checksums verified, K/V assembled); the files were just written, so
  they come from the page cache, not the disk itself;
- ``scaling_entries``, ``scaling_lookup_p50_ms``, ``scaling_lookup_p99_ms``, ``scaling_linear_p99_ms``: the same
  lookups (``scaling_queries`` index / ``scaling_linear_queries`` linear queries per point) on a cache filled with
  the first 1%, 3%, 10%, 30% and 100% of the same entries: lookup latency against the number of entries.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from array import array
from dataclasses import dataclass

import torch

from cache import DEVICE, Namespace, NormalKV, PrefixCache, shared_prefix_length
from chat.tools.bench.report import emit

NS = Namespace("bench", "float32")
VOCAB = 49_152


@dataclass(frozen=True)
class CacheBenchConfig:
    entries: int = 10_000
    tokens_per_entry: int = 2_000
    system_prompts: int = 20
    system_prompt_tokens: int = 300
    turn_tokens: int = 150
    queries: int = 1_000
    linear_queries: int = 50
    scaling_fractions: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)  # of ``entries``, for the scaling series
    scaling_queries: int = 300
    scaling_linear_queries: int = 20
    seed: int = 0


def _random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def chat_like_sequences(cfg: CacheBenchConfig) -> list[list[int]]:
    """``cfg.entries`` sequences of about ``cfg.tokens_per_entry`` tokens: a shared system prompt, then turns;
    every fifth sequence starts a new conversation, the others branch off an earlier one at a turn boundary."""
    rng = random.Random(cfg.seed)
    systems = [_random_tokens(rng, cfg.system_prompt_tokens) for _ in range(cfg.system_prompts)]
    out: list[list[int]] = []
    for i in range(cfg.entries):
        if i % 5 == 0 or not out:
            seq = list(rng.choice(systems))
        else:
            base = out[rng.randrange(max(0, len(out) - 50), len(out))]
            turns = (len(base) - cfg.system_prompt_tokens) // cfg.turn_tokens
            # cut strictly before the base's end, so the branch diverges and both stay entries
            seq = base[: cfg.system_prompt_tokens + rng.randrange(turns) * cfg.turn_tokens]
        while len(seq) < cfg.tokens_per_entry:
            seq += _random_tokens(rng, cfg.turn_tokens)
        out.append(seq)
    return out


class LinearScan:
    """The design we replace: every entry scanned on every lookup, longest valid prefix kept."""

    def __init__(self) -> None:
        self.entries: list[array] = []

    def add(self, tokens: list[int]) -> None:
        self.entries.append(array("q", tokens))

    def best(self, query: array) -> int:
        limit = len(query) - 1
        best = 0
        for tokens in self.entries:
            best = max(best, min(shared_prefix_length(tokens, query), limit))
        return best


def _p99(samples_s: list[float]) -> float:
    ordered = sorted(samples_s)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1e3


def _queries(seqs: list[list[int]], rng: random.Random, n: int, cfg: CacheBenchConfig) -> list[list[int]]:
    """Next turns of stored conversations, edits at a turn boundary, and a few cold prompts."""
    out = []
    for i in range(n):
        base = rng.choice(seqs)
        kind = i % 10
        if kind < 6:
            q = base + _random_tokens(rng, 64)  # the next turn of a stored conversation
        elif kind < 9:
            cut = cfg.system_prompt_tokens + rng.randrange(8) * cfg.turn_tokens
            q = base[:cut] + _random_tokens(rng, 64)  # an edit of an earlier turn
        else:
            q = _random_tokens(rng, 256)  # a cold prompt
        out.append(q)
    return out


def bench_lookup(cfg: CacheBenchConfig, seqs: list[list[int]]) -> dict[str, float]:
    buffer = torch.zeros(1, 1, max(len(s) for s in seqs), 1)  # entries view one buffer: memory stays small
    cache = PrefixCache()
    linear = LinearScan()
    t0 = time.perf_counter()
    for seq in seqs:
        view = buffer[..., : len(seq), :]
        cache.insert(NS, seq, [NormalKV(view, view)])
    insert_s = time.perf_counter() - t0
    for seq in seqs:
        linear.add(seq)
    rng = random.Random(cfg.seed + 1)
    queries = _queries(seqs, rng, cfg.queries, cfg)
    index_times = _lookup_times(cache, queries)
    scanned = queries[: cfg.linear_queries]
    linear_times, expected = _scan_times(linear, scanned)
    agree = 0
    for q, best in zip(scanned, expected, strict=True):
        match = cache.lookup(NS, q)
        agree += (match.length if match else 0) == best
    lookup_p99, linear_p99 = _p99(index_times), _p99(linear_times)
    return {
        "entries": cache.stats().entries,
        "mean_entry_tokens": round(statistics.fmean(len(s) for s in seqs)),
        "insert_mean_ms": insert_s / len(seqs) * 1e3,
        "lookup_p50_ms": statistics.median(index_times) * 1e3,
        "lookup_p99_ms": lookup_p99,
        "linear_p99_ms": linear_p99,
        "lookup_speedup": linear_p99 / lookup_p99,
        "linear_agreement": agree / len(linear_times),
    }


def bench_scaling(cfg: CacheBenchConfig, seqs: list[list[int]]) -> dict[str, list]:
    """Lookup p50/p99 (index) and p99 (linear scan) as the cache fills up with ``seqs``, at each scaling point."""
    points = sorted({max(1, round(f * len(seqs))) for f in cfg.scaling_fractions})
    buffer = torch.zeros(1, 1, max(len(s) for s in seqs), 1)
    cache, linear = PrefixCache(), LinearScan()
    rng = random.Random(cfg.seed + 2)
    out: dict[str, list] = {key: [] for key in ("entries", "lookup_p50_ms", "lookup_p99_ms", "linear_p99_ms")}
    filled = 0
    for n in points:
        for seq in seqs[filled:n]:
            view = buffer[..., : len(seq), :]
            cache.insert(NS, seq, [NormalKV(view, view)])
            linear.add(seq)
        filled = n
        queries = _queries(seqs[:n], rng, cfg.scaling_queries, cfg)
        times = _lookup_times(cache, queries)
        linear_times, _ = _scan_times(linear, queries[: cfg.scaling_linear_queries])
        out["entries"].append(cache.stats().entries)
        out["lookup_p50_ms"].append(statistics.median(times) * 1e3)
        out["lookup_p99_ms"].append(_p99(times))
        out["linear_p99_ms"].append(_p99(linear_times))
    return {f"scaling_{key}": values for key, values in out.items()}


def _lookup_times(cache: PrefixCache, queries: list[list[int]]) -> list[float]:
    """Seconds of each radix-index lookup of ``queries``."""
    times = []
    for q in queries:
        t = time.perf_counter()
        cache.lookup(NS, q)
        times.append(time.perf_counter() - t)
    return times


def _scan_times(linear: LinearScan, queries: list[list[int]]) -> tuple[list[float], list[int]]:
    """Seconds of each linear-scan lookup of ``queries``, and the longest prefix each found."""
    times, found = [], []
    for q in queries:
        keys = array("q", q)
        t = time.perf_counter()
        found.append(linear.best(keys))
        times.append(time.perf_counter() - t)
    return times, found


def _kv(tokens: int, layers: int = 30, heads: int = 3, dim: int = 64) -> list[NormalKV]:
    return [NormalKV(torch.randn(1, heads, tokens, dim), torch.randn(1, heads, tokens, dim)) for _ in range(layers)]


def bench_materialize(tokens: int = 4_096, repeats: int = 50) -> float:
    cache = PrefixCache()
    cache.insert(NS, list(range(tokens)), _kv(tokens))
    query = [*range(tokens), 7]
    match = cache.lookup(NS, query)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        lease = cache.acquire(match, NS)
        cache.release(lease)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_disk(tokens: int = 4_096, repeats: int = 3) -> dict[str, float]:
    """Write a SmolLM2-shaped entry through the disk tier, then read it back after a restart (median times)."""
    layers = _kv(tokens)
    query = [*range(tokens), 7]
    writes, reads = [], []
    mib = 0.0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="turncache-bench-") as tmp:
            cache = PrefixCache(disk_dir=tmp, disk_budget_bytes=2**40)
            t = time.perf_counter()
            cache.insert(NS, list(range(tokens)), layers)
            assert cache.flush(timeout=600), "the disk tier did not write the entry"
            writes.append(time.perf_counter() - t)
            mib = cache.stats().bytes_per_tier["disk"] / 2**20
            cache.close()
            restarted = PrefixCache(disk_dir=tmp, disk_budget_bytes=2**40)
            t = time.perf_counter()
            match = restarted.lookup(NS, query)
            reads.append(time.perf_counter() - t)
            assert match is not None and match.length == tokens and restarted.stats().disk_reads == 1
            restarted.close()
    return {
        "disk_write_ms_4k": statistics.median(writes) * 1e3,
        "disk_read_ms_4k": statistics.median(reads) * 1e3,
        "disk_entry_mib": mib,
    }


def bench_conversation(turns: int = 20, prompt_tokens: int = 64, reply_tokens: int = 48) -> float:
    """Store a conversation as the engine does; return bytes held / bytes of the final K/V."""
    cache = PrefixCache()
    rng = random.Random(3)
    tokens: list[int] = []
    kv: list[NormalKV] | None = None
    for _ in range(turns):
        prompt = tokens + _random_tokens(rng, prompt_tokens)
        match = cache.lookup(NS, prompt)
        lease = cache.acquire(match, NS) if match else None
        base = list(lease.layers) if lease else None

        def grow(n: int, base=base, lease=lease) -> list[NormalKV]:
            start = lease.length if lease else 0
            fresh = _kv(n - start, layers=4)
            if base is None:
                return fresh
            return [
                NormalKV(torch.cat([b.keys, f.keys], -2), torch.cat([b.values, f.values], -2))
                for b, f in zip(base, fresh, strict=True)
            ]

        cache.insert(NS, prompt, grow(len(prompt)))
        tokens = prompt + _random_tokens(rng, reply_tokens)
        kv = grow(len(tokens))
        cache.insert(NS, tokens, kv)
        if lease:
            cache.release(lease)
    assert kv is not None
    final = sum(t.untyped_storage().nbytes() for layer in kv for t in (layer.keys, layer.values))
    return cache.stats().bytes_per_tier[DEVICE] / final


def run(cfg: CacheBenchConfig | None = None) -> dict:
    cfg = cfg or CacheBenchConfig()
    torch.set_num_threads(1)
    seqs = chat_like_sequences(cfg)
    result: dict = bench_lookup(cfg, seqs)
    result["materialize_ms_4k"] = bench_materialize()
    result["conversation_bytes_ratio"] = bench_conversation()
    result.update(bench_disk())
    result.update(bench_scaling(cfg, seqs))
    return result


TARGETS = {
    "lookup_p99_ms": ("<=", 1.0),
    "lookup_speedup": (">=", 50.0),
    "materialize_ms_4k": ("<=", 1.0),
    "conversation_bytes_ratio": ("<=", 1.1),
}


def main(as_json: bool, entries: int | None = None) -> int:
    cfg = CacheBenchConfig() if entries is None else CacheBenchConfig(entries=entries)
    result = run(cfg)
    emit(result, TARGETS, as_json)
    return 0
