"""Every ``--json`` benchmark prints exactly one JSON object on standard output, everything else on standard error.

The CLI runs a benchmark under ``report.json_stdout``; the first test pins that guard with the kinds of output that
broke ``bench cluster`` (a library's print, a child process's lines, as Ray's raylet writes them). The others run
real benchmarks' ``--json`` paths in a subprocess and parse standard output with ``json.loads``: those cheap enough
on tiny models here (``bench cache`` with few entries, ``bench http`` on tiny-llama at one level, one round). Not
run here, for time on a 2-core machine: ``turns``, ``serve``, ``load``, ``batch``, ``multiturn``, ``agent``,
``constrained`` (minutes each even on tiny models), ``weights`` (the built-in model only), ``restart`` (three server
processes) and ``cluster`` (Ray); they all print through the same ``emit`` under the same guard.
"""

import json
import subprocess
import sys
import textwrap

GUARDED = textwrap.dedent(
    """
    import os, subprocess, sys
    from chat.tools.bench.report import emit, json_stdout
    with json_stdout():
        print("(raylet) Task ServeController failed")  # a library's print
        subprocess.run(["echo", "(raylet) from a child process"], check=True)
        os.write(1, b"written on fd 1\\n")
        emit({"answer": 42}, {}, as_json=True)
    print("after the benchmark")
    """
)


def test_the_guard_leaves_only_the_json_object_on_stdout():
    done = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True, check=True)
    first, *rest = done.stdout.splitlines()
    assert json.loads(first) == {"answer": 42} and rest == ["after the benchmark"]
    assert "(raylet) Task ServeController failed" in done.stderr and "(raylet) from a child process" in done.stderr
    assert "written on fd 1" in done.stderr


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
