"""PNG charts of a `turncache bench` run, drawn from its JSON object (so they can be redrawn from a saved file).

Each chart reads the keys of one benchmark and is skipped when that benchmark is missing or failed:

- ``ttft_per_turn.png``: multiturn — time to first token (p50) per turn, with and without the prefix cache;
- ``cached_ratio_per_turn.png``: multiturn — cached / prompt tokens per turn, with and without the cache;
- ``lookup_vs_entries.png``: cache — lookup p50 / p99 (radix index) and p99 (linear scan) against entries;
- ``concurrent_ttft.png``: serve and load — the distribution of time to first token at 8 and 32 concurrent sessions;
- ``batch_throughput.png``: batch — aggregate completion tokens/s against concurrent sessions, with the single
  stream rates (speculation off and on) and stock transformers ``generate``.

matplotlib is used through its object API with the Agg canvas: no pyplot, no global backend switch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Results = Mapping[str, Any]


def _figure(title: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _usable(results: Results, name: str) -> Mapping[str, Any] | None:
    block = results.get(name)
    return block if isinstance(block, Mapping) and "error" not in block else None


def ttft_per_turn(results: Results, path: Path) -> bool:
    mt = _usable(results, "multiturn")
    if mt is None:
        return False
    hit, miss = mt["ttft_p50_ms_per_turn_cache"], mt["ttft_p50_ms_per_turn_nocache"]
    turns = range(1, len(hit) + 1)
    fig, ax = _figure(f"Time to first token per turn, p50 ({mt['model']}, {mt['conversations']} concurrent chats)")
    width = 0.38
    bars = ax.bar([t - width / 2 for t in turns], miss, width, label="without prefix cache", color="#c44e52")
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    bars = ax.bar([t + width / 2 for t in turns], hit, width, label="with prefix cache", color="#4c72b0")
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(list(turns))
    ax.set_xlabel("turn")
    ax.set_ylabel("ms")
    ax.legend()
    fig.savefig(path)
    return True


def cached_ratio_per_turn(results: Results, path: Path) -> bool:
    mt = _usable(results, "multiturn")
    if mt is None:
        return False
    hit, miss = mt["cached_token_ratio_per_turn_cache"], mt["cached_token_ratio_per_turn_nocache"]
    turns = range(1, len(hit) + 1)
    fig, ax = _figure("Cached / prompt tokens per turn")
    width = 0.38
    ax.bar([t - width / 2 for t in turns], miss, width, label="without prefix cache", color="#c44e52")
    bars = ax.bar([t + width / 2 for t in turns], hit, width, label="with prefix cache", color="#4c72b0")
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(list(turns))
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("turn")
    ax.set_ylabel("cached token ratio")
    ax.legend(loc="upper left")
    fig.savefig(path)
    return True


def lookup_vs_entries(results: Results, path: Path) -> bool:
    cb = _usable(results, "cache")
    if cb is None or "scaling_entries" not in cb:
        return False
    entries = cb["scaling_entries"]
    fig, ax = _figure(f"Prefix lookup latency (entries of ~{cb['mean_entry_tokens']:,} tokens)")
    ax.plot(entries, cb["scaling_linear_p99_ms"], "s-", label="linear scan p99", color="#c44e52")
    ax.plot(entries, cb["scaling_lookup_p99_ms"], "o-", label="radix index p99", color="#4c72b0")
    ax.plot(entries, cb["scaling_lookup_p50_ms"], "o--", label="radix index p50", color="#8fa8d0")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("entries in the cache")
    ax.set_ylabel("ms per lookup")
    ax.legend()
    fig.savefig(path)
    return True


def concurrent_ttft(results: Results, path: Path) -> bool:
    groups = []
    for name in ("serve", "load"):
        block = _usable(results, name)
        if block is not None and block.get("ttft_ms_samples"):
            groups.append((f"{block['sessions']} sessions\n(bench {name})", block["ttft_ms_samples"]))
    if not groups:
        return False
    fig, ax = _figure("Time to first token under concurrent WebSocket sessions")
    ax.boxplot([samples for _, samples in groups], whis=(1, 99), showfliers=False, widths=0.5)
    ax.set_xticks(range(1, len(groups) + 1), [label for label, _ in groups])
    ax.set_ylabel("ms (box: p25-p75, line: p50, whiskers: p1-p99)")
    fig.savefig(path)
    return True


def batch_throughput(results: Results, path: Path) -> bool:
    bb = _usable(results, "batch")
    if bb is None:
        return False
    levels, rates = bb["levels"], bb["aggregate_tokens_per_s"]
    fig, ax = _figure(f"Aggregate decode throughput ({bb['model']}, {bb['weights']} weights)")
    ax.plot(levels, rates, "o-", color="#4c72b0", label="turncache, all sessions together")
    for x, y in zip(levels, rates, strict=True):
        ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.axhline(bb["single_stream_tokens_per_s"], color="#55a868", ls="--", label="one stream, no speculation")
    ax.axhline(bb["hf_generate_tokens_per_s"], color="#c44e52", ls=":", label="transformers generate (float32)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(n) for n in levels])
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("completion tokens / s")
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path)
    return True


CHARTS: tuple[tuple[str, Callable[[Results, Path], bool]], ...] = (
    ("ttft_per_turn.png", ttft_per_turn),
    ("cached_ratio_per_turn.png", cached_ratio_per_turn),
    ("lookup_vs_entries.png", lookup_vs_entries),
    ("concurrent_ttft.png", concurrent_ttft),
    ("batch_throughput.png", batch_throughput),
)


def draw_all(results: Results, out_dir: Path) -> list[Path]:
    """Write every chart whose data is in ``results`` into ``out_dir``; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, draw in CHARTS:
        if draw(results, out_dir / filename):
            written.append(out_dir / filename)
    return written
