"""Every ``--json`` benchmark prints exactly one JSON object on standard output, everything else on standard error.

The CLI runs a benchmark under ``report.json_stdout`` (pinned in test_report.py with the kinds of output that broke
``bench cluster``). These tests run real benchmarks' ``--json`` paths in a subprocess and parse standard output with
``json.loads``: those cheap enough on tiny models here (``bench cache`` with few entries, ``bench http`` on tiny-llama
at one level, one round). Not run here, for time on a 2-core machine: ``turns``, ``serve``, ``load``, ``batch``,
``multiturn``, ``agent``, ``constrained`` (minutes each even on tiny models), ``weights`` (the built-in model only),
``restart`` (three server processes) and ``cluster`` (Ray); they all print through the same ``emit`` under the same
guard.
"""

import json
import subprocess
import sys


def _bench_json(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "chat.cli", "bench", *args, "--json"], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # the whole of standard output: one object, nothing else


def test_bench_cache_json_is_alone_on_stdout():
    assert _bench_json("cache", "--entries", "200")["entries"] == 200


def test_bench_http_json_is_alone_on_stdout():
    result = _bench_json("http", "--model", "tiny-llama", "--levels", "1", "--rounds", "1")
    assert result["levels"] == [1] and result["errors"] == 0
