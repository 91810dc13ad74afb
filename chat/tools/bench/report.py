"""How every benchmark prints its result: one JSON object, or a readable table with the issue's targets.

With ``--json`` the JSON object is the only thing on standard output: :func:`json_stdout` sends everything else
written there while a benchmark runs (prints, libraries, Ray's ``(raylet)`` lines, child processes started meanwhile)
to standard error, and :func:`emit` writes the object to the real standard output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TextIO

_json_out: TextIO | None = None  # where emit() writes the JSON object while json_stdout() is active


def _shown(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list) and len(value) > 8:  # samples: their count and range
        return f"{len(value)} values, {min(value, default=0):.4g}..{max(value, default=0):.4g}"
    if isinstance(value, list):  # a series (per turn, per entry count): compact
        return "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def format_table(result: Mapping[str, object], targets: Mapping[str, tuple[str, float]]) -> str:
    lines = [f"{'figure':<28}{'value':>14}  target"]
    for key, value in result.items():
        target = targets.get(key)
        shown = _shown(value)
        lines.append(f"{key:<28}{shown:>14}  {'' if target is None else ' '.join(map(str, target))}")
    return "\n".join(lines)


def json_output() -> TextIO:
    """Where a JSON result goes: the real standard output (see :func:`json_stdout`)."""
    return _json_out or sys.stdout


def emit(result: Mapping[str, object], targets: Mapping[str, tuple[str, float]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), file=json_output(), flush=True)
    else:
        print(format_table(result, targets))


@contextlib.contextmanager
def json_stdout() -> Iterator[TextIO]:
    """While active, standard output (Python's and file descriptor 1, which child processes inherit) is standard
    error; yields the real standard output, where :func:`emit` writes."""
    global _json_out
    original = sys.stdout
    original.flush()
    try:
        on_fd1 = original.fileno() == 1
    except (AttributeError, OSError, io.UnsupportedOperation):  # a replaced stream (pytest's capsys, say)
        on_fd1 = False
    saved = os.dup(1) if on_fd1 else None
    out = os.fdopen(os.dup(saved), "w") if saved is not None else original
    if saved is not None:
        os.dup2(2, 1)
    sys.stdout, _json_out = sys.stderr, out
    try:
        yield out
    finally:
        sys.stdout, _json_out = original, None
        if saved is not None:
            out.close()
            os.dup2(saved, 1)
            os.close(saved)
