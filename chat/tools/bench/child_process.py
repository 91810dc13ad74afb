"""A benchmark's helper process: ``python -m <module> <config as JSON>`` run from this checkout, which says "ready"
on its first line once it is set up, is told to go on (or stop) by a line on its standard input, and reports one JSON
object on its last line. The clients of ``bench http`` and its bad clients run this way, apart from the server's
process and its interpreter lock."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def ready_child(module: str, config: dict, what: str) -> Iterator[subprocess.Popen]:
    """The process of ``module``, once it has said "ready"; killed on leaving if it is still running. ``what``
    names it in errors.

    Raises:
        RuntimeError: it did not say "ready".
    """
    import chat

    root = str(Path(chat.__file__).resolve().parents[1])  # this checkout's package, wherever the bench runs from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", module, json.dumps(config)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{what} did not start (said {line!r}, exit {process.poll()})")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def child_report(process: subprocess.Popen, line: str, timeout_s: float, what: str) -> dict:
    """Send ``line`` to a ready child, wait for it to end; its report (the last line it printed).

    Raises:
        RuntimeError: it failed or printed nothing.
        subprocess.TimeoutExpired: it did not end within ``timeout_s``.
    """
    out, _ = process.communicate(line, timeout=timeout_s)
    if process.returncode != 0 or not out.strip():
        raise RuntimeError(f"{what} failed (exit {process.returncode})")
    return json.loads(out.strip().splitlines()[-1])
