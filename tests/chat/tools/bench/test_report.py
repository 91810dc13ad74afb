"""chat/tools/bench/report.py: a result as one JSON object alone on standard output (``json_stdout``, ``emit``), or
as a table of figures beside the issue's targets (``format_table``)."""

import json
import subprocess
import sys
import textwrap

from chat.tools.bench.report import emit, format_table, json_output, json_stdout

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


def test_under_a_replaced_stdout_the_guard_still_sends_prints_to_stderr_and_the_object_to_stdout(capsys):
    with json_stdout() as out:
        print("progress")
        assert json_output() is out
        emit({"a": 1.5, "b": [1, 2]}, {"a": (">=", 1.0)}, as_json=True)
    assert json_output() is sys.stdout  # restored on leaving
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"a": 1.5, "b": [1, 2]} and captured.err == "progress\n"


def test_the_table_shows_each_figure_with_its_target():
    table = format_table({"lookup_p99_ms": 0.123456, "errors": 0, "entries": 12345}, {"lookup_p99_ms": ("<=", 1.0)})
    header, p99, errors, entries = table.splitlines()
    assert header.split() == ["figure", "value", "target"]
    assert p99.split() == ["lookup_p99_ms", "0.1235", "<=", "1.0"]
    assert errors.split() == ["errors", "0"] and entries.split() == ["entries", "12,345"]


def test_the_table_shortens_samples_and_keeps_series_and_flags_readable():
    table = format_table(
        {"samples": [float(i) for i in range(20)], "per_turn": [0.5, 0.25, 3], "on": True, "model": "tiny"}, {}
    )
    samples, per_turn, on, model = table.splitlines()[1:]
    assert samples.split()[1:] == ["20", "values,", "0..19"]
    assert per_turn.split()[1:] == ["[0.5,", "0.25,", "3]"]
    assert on.split()[1:] == ["True"] and model.split()[1:] == ["tiny"]  # a bool is not a count


def test_emit_prints_the_table_without_json(capsys):
    emit({"ratio": 2.0}, {"ratio": (">=", 1.5)}, as_json=False)
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["ratio", "2.0000", ">=", "1.5"]
