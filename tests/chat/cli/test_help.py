"""`--help` of every command against snapshots in data/: a flag, default, help string or usage line that changes
shows here. The snapshots were taken from chat/cli.py before it became the chat/cli package; after a deliberate
change of the help, rewrite them with ``TURNCACHE_WRITE_HELP_SNAPSHOTS=1 pytest tests/chat/cli/test_help.py``
and read the diff."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat.cli import build_parser, main

DATA = Path(__file__).parent / "data"
BENCHMARKS = (
    "cache",
    "weights",
    "turns",
    "serve",
    "load",
    "batch",
    "multiturn",
    "agent",
    "constrained",
    "http",
    "lora",
    "chat",
    "restart",
    "cluster",
    "tenants",
)
COMMANDS = [(), ("serve",), ("chat",), ("eval",), ("bench",), *(("bench", name) for name in BENCHMARKS)]


def snapshot(words: tuple[str, ...]) -> Path:
    return DATA / ("_".join(("turncache", *words)) + ".txt")


@pytest.mark.parametrize("words", COMMANDS, ids=lambda words: " ".join(words) or "turncache")
def test_the_help_of_each_command_is_its_snapshot(words, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "120")  # argparse wraps to the terminal's width
    with pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    if os.environ.get("TURNCACHE_WRITE_HELP_SNAPSHOTS") == "1":
        snapshot(words).write_text(out)
    assert out == snapshot(words).read_text()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_and_benchmark_has_a_snapshot_and_no_snapshot_is_left_over():
    commands = subcommands(build_parser())
    assert list(commands) == ["serve", "chat", "eval", "bench"]
    assert tuple(subcommands(commands["bench"])) == BENCHMARKS
    assert sorted(DATA.glob("*.txt")) == sorted(snapshot(words) for words in COMMANDS)


def test_python_dash_m_chat_cli_is_the_command():
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "chat.cli", "bench", "tenants", "--help"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == snapshot(("bench", "tenants")).read_text(), done.stderr
