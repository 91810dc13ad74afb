"""`turncache bench` with no benchmark named: every benchmark in one process, one JSON file, PNG charts.

The benchmarks run one after another, in the order of :data:`BENCHMARKS`, on one model (loaded once and shared by
the benchmarks that take a loaded runtime). Each one's object is stored under its name, unchanged from what
`turncache bench NAME --json` prints; a benchmark that raises is stored as ``{"error": "..."}`` and the others
still run. The file also holds ``machine`` (CPU, cores, memory, torch / transformers / Python versions, date),
``elapsed_s``, ``loadavg_before`` (the 1-minute load average when each benchmark started: with two cores, any
other load distorts timings) and ``rss_before_mib`` (this process's resident memory when each benchmark started,
after collecting what the previous one left behind). Charts are drawn from the saved object by
:mod:`chat.tools.bench.charts`.

Each benchmark runs in a thread of its own (:func:`chat.tools.bench.threads.in_fresh_thread`), with the torch
threads this process had, so that no OpenMP pool outlives it and slows the next one's engines down.

Adding a benchmark is one line in :data:`BENCHMARKS`: a name and a callable from the run's :class:`Suite` to the
benchmark's JSON object.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chat.tools.bench import batch_bench, cache_bench, load_bench, multiturn_bench, report, serve_bench, turns_bench
from chat.tools.bench.charts import draw_all
from chat.tools.bench.threads import in_fresh_thread, leave_parallelism_to_engines

RESULTS_FILE = "bench.json"


@dataclass
class Suite:
    """What one `turncache bench` run shares between its benchmarks."""

    model: str = "smollm2"  # model spec for every model benchmark
    media_model: str = "tiny-omni"  # the multimodal turns benchmark's model (images, audio, video)
    sizes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-benchmark keyword overrides (tests)
    _runtime: Any = None  # the model, loaded on first use

    def runtime(self):
        if self._runtime is None:
            from chat.models import load_model

            self._runtime = load_model(self.model)
        return self._runtime

    def kw(self, name: str) -> dict[str, Any]:
        return dict(self.sizes.get(name, {}))


BENCHMARKS: tuple[tuple[str, Callable[[Suite], dict]], ...] = (
    ("cache", lambda s: cache_bench.run(cache_bench.CacheBenchConfig(**s.kw("cache")))),
    ("turns", lambda s: turns_bench.run(s.model, **s.kw("turns"))),
    ("media_turns", lambda s: turns_bench.run(s.media_model, **s.kw("media_turns"))),
    ("multiturn", lambda s: multiturn_bench.run_on(s.runtime(), multiturn_bench.MultiTurnConfig(**s.kw("multiturn")))),
    ("serve", lambda s: serve_bench.run_on(s.runtime(), **s.kw("serve"))),
    ("load", lambda s: load_bench.run_on(s.runtime(), **s.kw("load"))),
    ("batch", lambda s: batch_bench.run(s.model, **s.kw("batch"))),
)


def machine_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = None
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory / 1024**3, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def run_all(suite: Suite, out_dir: Path, *, log=None) -> dict[str, Any]:
    """Run every benchmark, write ``out_dir/bench.json`` and the charts; returns the JSON object."""
    import torch

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    results: dict[str, Any] = {"model": suite.model, "machine": machine_info()}
    for key in ("elapsed_s", "loadavg_before", "rss_before_mib"):
        results[key] = {}
    threads = torch.get_num_threads()
    leave_parallelism_to_engines()  # each benchmark runs in a thread of its own (chat.tools.bench.threads)
    for name, bench in BENCHMARKS:
        log(f"bench {name} ...")
        # the previous benchmark's engines and caches are garbage in reference cycles: free them before the next
        results["rss_before_mib"][name] = round(load_bench.settled_rss_mib(), 1)
        results["loadavg_before"][name] = round(os.getloadavg()[0], 2)
        t0 = time.perf_counter()
        try:  # in a thread of its own, which takes its OpenMP pool along when it ends
            results[name] = in_fresh_thread(lambda bench=bench: bench(suite), threads)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            traceback.print_exception(exc, file=sys.stderr)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results["elapsed_s"][name] = round(time.perf_counter() - t0, 1)
        log(f"bench {name}: {'failed' if 'error' in results[name] else 'done'} in {results['elapsed_s'][name]} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    results["charts"] = [str(p) for p in draw_all(results, out_dir)]
    return results


def failed(results: Mapping[str, Any]) -> list[str]:
    return [name for name, _ in BENCHMARKS if "error" in results.get(name, {"error": "missing"})]


def main(out_dir: Path, model: str = "smollm2", as_json: bool = False) -> int:
    results = run_all(Suite(model=model), out_dir)
    if as_json:
        print(json.dumps({k: v for k, v in results.items() if k != "charts"}), file=report.json_output(), flush=True)
    else:
        print(f"wrote {out_dir / RESULTS_FILE}")
        for path in results["charts"]:
            print(f"wrote {path}")
    bad = failed(results)
    if bad:
        print(f"turncache: failed: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0
