"""No source module of ``cache/``, ``modalities/`` and ``chat/`` over ``MAX_FILE_LINES`` lines and no function over
``MAX_FUNCTION_LINES`` (issue 38: a newcomer reads a module whole and a function at once)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "modalities", "chat")
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def long_functions(path: Path, most: int) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [
        f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > most
    ]


def test_the_function_check_sees_a_long_function(tmp_path):
    path = tmp_path / "probe.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    (found,) = long_functions(path, MAX_FUNCTION_LINES)
    assert found == "probe.py:5 long (121 lines)"


def test_no_source_file_is_over_the_limit():
    lines = {p: len(p.read_text().splitlines()) for p in sources()}
    assert [f"{p.relative_to(ROOT)} ({n} lines)" for p, n in lines.items() if n > MAX_FILE_LINES] == []


def test_no_function_is_over_the_limit():
    assert [f for p in sources() for f in long_functions(p, MAX_FUNCTION_LINES)] == []
