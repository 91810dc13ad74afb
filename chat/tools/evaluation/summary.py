"""The run summary, computed from result records (so a resumed run summarizes the whole dataset).

Definitions (also in docs/eval.md):

- ``ttft_p50_ms`` / ``ttft_p95_ms``: percentiles (linear interpolation between ranks) of ``timings.ttft_ms`` over
  the turns without error that generated a token;
- ``cached_ratio``: sum of ``cached_tokens`` / sum of ``prompt_tokens`` over turns without error;
  ``cached_ratio_later``: the same over turns after each conversation's first (where a multi-turn cache pays off);
- ``decode_tokens_per_s``: the median of ``timings.decode_tokens_per_s`` over turns that generated 2+ tokens;
- ``exact_match_rate``: matches / turns with a reference (failed turns count as misses).

A figure with nothing to measure is None (shown as "-").
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from chat.tools.evaluation.results import Record


@dataclass(frozen=True, slots=True)
class Summary:
    conversations: int  # conversations (dataset lines) summarized
    conversations_with_errors: int  # conversations with at least one failed turn
    turns: int  # turn records
    errors: int  # turns with an error
    error_codes: dict[str, int] = field(default_factory=dict)  # failed turns by error code
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    cached_ratio: float | None = None  # cached / prompt tokens, all turns without error
    cached_ratio_later: float | None = None  # the same, turns after the first
    decode_tokens_per_s: float | None = None  # median over turns with 2+ completion tokens
    references: int = 0  # turns with a reference
    exact_matches: int = 0  # of those, replies that matched
    exact_match_rate: float | None = None  # exact_matches / references

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Iterable[Record]) -> Summary:
    records = list(records)
    failed = [r for r in records if r.get("error")]
    ok = [r for r in records if not r.get("error") and r.get("usage")]
    ttfts = [r["timings"]["ttft_ms"] for r in ok if r["timings"].get("ttft_ms") is not None]
    decode = [
        r["timings"]["decode_tokens_per_s"]
        for r in ok
        if r["usage"]["completion_tokens"] >= 2 and "decode_tokens_per_s" in r["timings"]
    ]
    with_ref = [r for r in records if r.get("exact_match") is not None]
    matches = sum(1 for r in with_ref if r["exact_match"])
    return Summary(
        conversations=len({r["id"] for r in records}),
        conversations_with_errors=len({r["id"] for r in failed}),
        turns=len(records),
        errors=len(failed),
        error_codes=dict(Counter(r["error"]["code"] for r in failed).most_common()),
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        cached_ratio=_ratio(ok),
        cached_ratio_later=_ratio([r for r in ok if r["turn"] > 0]),
        decode_tokens_per_s=statistics.median(decode) if decode else None,
        references=len(with_ref),
        exact_matches=matches,
        exact_match_rate=matches / len(with_ref) if with_ref else None,
    )


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), interpolating linearly between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def format_summary(s: Summary) -> str:
    """The summary as an aligned two-column table."""
    codes = ", ".join(f"{code} {n}" for code, n in s.error_codes.items())
    rows = [
        ("conversations", f"{s.conversations}", f"{s.conversations_with_errors} with errors"),
        ("turns", f"{s.turns}", f"{s.errors} errors" + (f" ({codes})" if codes else "")),
        ("ttft p50 / p95 ms", f"{_num(s.ttft_p50_ms, 1)} / {_num(s.ttft_p95_ms, 1)}", ""),
        ("cached / prompt tokens", _num(s.cached_ratio, 3), f"turns after the first: {_num(s.cached_ratio_later, 3)}"),
        ("decode tokens/s", _num(s.decode_tokens_per_s, 1), "median"),
        (
            "exact match",
            _num(s.exact_match_rate, 3),
            f"{s.exact_matches} of {s.references} turns with a reference" if s.references else "no references",
        ),
    ]
    width = max(len(r[1]) for r in rows)
    return "\n".join(f"{name:<24}{value:>{width}}  {note}".rstrip() for name, value, note in rows)


def _ratio(records: list[Record]) -> float | None:
    prompt = sum(r["usage"]["prompt_tokens"] for r in records)
    return sum(r["usage"]["cached_tokens"] for r in records) / prompt if prompt else None


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
