"""`bench cache` (chat/tools/bench/cache_bench.py): its keys through the CLI (it needs no model), the chat-shaped
entries it fills the cache with, the linear scan it compares against, and its p99."""

import json
import random
from array import array

import pytest

from chat.cli import main
from chat.tools.bench.cache_bench import CacheBenchConfig, LinearScan, _p99, _queries, chat_like_sequences


def test_bench_cache_prints_one_json_object_with_the_issue_keys(capsys):
    assert main(["bench", "cache", "--json", "--entries", "200"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "lookup_p99_ms",
        "linear_p99_ms",
        "lookup_speedup",
        "materialize_ms_4k",
        "conversation_bytes_ratio",
        "disk_write_ms_4k",
        "disk_read_ms_4k",
    ):
        assert isinstance(result[key], float) and result[key] > 0
    assert result["entries"] == 200
    assert result["linear_agreement"] == 1.0  # index and linear scan found the same prefix lengths
    assert result["conversation_bytes_ratio"] == pytest.approx(1.0)


def test_bench_cache_table_without_json(capsys):
    assert main(["bench", "cache", "--entries", "50"]) == 0
    out = capsys.readouterr().out
    assert "lookup_p99_ms" in out and not out.lstrip().startswith("{")


SMALL = CacheBenchConfig(entries=40, tokens_per_entry=200, system_prompts=3, system_prompt_tokens=30, turn_tokens=20)


def test_the_entries_open_with_a_shared_system_prompt_and_branch_at_turn_boundaries():
    seqs = chat_like_sequences(SMALL)
    assert len(seqs) == 40 and all(len(s) >= SMALL.tokens_per_entry for s in seqs)
    systems = {tuple(s[: SMALL.system_prompt_tokens]) for s in seqs}
    assert 1 < len(systems) <= SMALL.system_prompts  # shared by many conversations
    assert len({tuple(s) for s in seqs}) == len(seqs)  # a branch diverges: every sequence is its own entry
    for i, seq in enumerate(seqs):
        if i % 5:  # a branch of an earlier sequence, cut at a turn boundary
            shared = max(_shared(seq, other) for other in seqs[:i])
            assert shared >= SMALL.system_prompt_tokens
            assert (shared - SMALL.system_prompt_tokens) % SMALL.turn_tokens == 0
    assert chat_like_sequences(SMALL) == seqs  # seeded


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_linear_scan_finds_the_longest_prefix_short_of_the_querys_last_token():
    scan = LinearScan()
    for tokens in ([1, 2, 3, 4], [1, 2, 9], [5, 6]):
        scan.add(tokens)
    assert scan.best(array("q", [1, 2, 3, 4, 7])) == 4
    assert scan.best(array("q", [1, 2, 3, 4])) == 3  # the last token is always computed, never reused
    assert scan.best(array("q", [1, 2, 9, 9])) == 3
    assert scan.best(array("q", [8, 8])) == 0


def test_p99_is_the_99th_percentile_sample_in_milliseconds():
    assert _p99([i / 1000 for i in range(1, 101)]) == pytest.approx(99.0)
    assert _p99([0.002]) == pytest.approx(2.0)
    assert _p99([0.005, 0.001, 0.003]) == pytest.approx(5.0)


def test_queries_are_next_turns_edits_and_a_few_cold_prompts():
    seqs = chat_like_sequences(SMALL)
    queries = _queries(seqs, random.Random(1), 20, SMALL)
    stored = {tuple(s) for s in seqs}
    next_turns = [q for q in queries if tuple(q[:-64]) in stored]
    cold = [q for q in queries if len(q) == 256 and not any(_shared(q, s) for s in seqs)]
    assert len(next_turns) >= 12 and len(cold) == 2  # 6 in 10 are next turns, 1 in 10 cold
