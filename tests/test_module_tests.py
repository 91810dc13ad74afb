"""Every source module of ``cache/``, ``modalities/`` and ``chat/`` with behaviour of its own has a test module named
after it in the mirrored folder (``chat/server/reply/reader.py`` -> ``tests/chat/server/reply/test_reader.py``), so
that a newcomer finds a module's tests by its name (issue 38). Behaviour-named suites that cut across modules live
beside them. A package's ``__init__`` with code of its own (functions, classes) names its test module in
``PACKAGE_TESTS``; a module without behaviour of its own (records, constants, declarations, an entry point) is listed
in ``WITHOUT_OWN_BEHAVIOUR`` with the reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cache", "modalities", "chat")

WITHOUT_OWN_BEHAVIOUR = {
    "cache/tiers.py": "the tiers' names and their order: constants",
    "chat/cli/__main__.py": "an entry point that calls chat.cli.main (every `python -m chat.cli` test runs it)",
    "chat/engine/events.py": "the engine's input and output records (Usage.total_tokens: a sum that usage tests read)",
    "chat/engine/runtime.py": "the protocol a model implements, its Feed record and StepInterrupted: tested through "
    "the fake runtime (tests/chat/engine/fakes.py) and the real ones (tests/chat/models)",
    "chat/models/tiny/templates.py": "chat template texts of the tiny models (rendered by tests/chat/models/test_text)",
    "chat/protocol/errors.py": "the ErrorCode table and one exception: asserted by test_parser and test_connection",
    "chat/protocol/limits.py": "the protocol's limits: constants",
    "chat/protocol/tools.py": "tool declarations on the wire, no validators of their own (test_client_events, "
    "test_parser)",
}

PACKAGE_TESTS = {  # a package __init__ with code of its own -> its test module
    "chat/cli/__init__.py": "tests/chat/cli/test_help.py",
    "chat/models/__init__.py": "tests/chat/models/test_exports.py",
    "chat/models/hf/__init__.py": "tests/chat/models/hf/test_forward_on_demand.py",
    "modalities/__init__.py": "tests/modalities/test_exports.py",
}


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def has_code(path: Path) -> bool:
    """Whether a module defines functions or classes at its top level."""
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body)


def missing_tests(root: Path = ROOT) -> list[str]:
    missing = []
    for path in sorted(p for package in PACKAGES for p in (root / package).rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in WITHOUT_OWN_BEHAVIOUR:
            continue
        if path.name == "__init__.py":
            wanted = PACKAGE_TESTS.get(name)
            if wanted is None and not has_code(path):
                continue  # a docstring, re-exports
            if wanted is None or not (root / wanted).is_file():
                missing.append(f"{name} (code of its own: name its test module in PACKAGE_TESTS)")
            continue
        test = root / "tests" / path.parent.relative_to(root) / f"test_{path.name}"
        if not test.is_file():
            missing.append(f"{name} -> {test.relative_to(root).as_posix()}")
    return missing


def test_every_module_with_behaviour_has_a_test_module_named_after_it():
    assert missing_tests() == []


def test_the_lists_name_only_modules_that_exist_and_have_no_test_module_of_their_name():
    assert [m for m in [*WITHOUT_OWN_BEHAVIOUR, *PACKAGE_TESTS] if not (ROOT / m).is_file()] == []
    named = [ROOT / "tests" / Path(m).parent / f"test_{Path(m).name}" for m in WITHOUT_OWN_BEHAVIOUR]
    assert [t.relative_to(ROOT).as_posix() for t in named if t.is_file()] == []  # listed, yet tested by its name
    assert [t for t in PACKAGE_TESTS.values() if not (ROOT / t).is_file()] == []


def test_the_check_sees_a_module_without_its_test_and_a_package_with_code(tmp_path):
    (tmp_path / "chat" / "room").mkdir(parents=True)
    (tmp_path / "chat" / "room" / "__init__.py").write_text("def helper():\n    pass\n")
    (tmp_path / "chat" / "room" / "tested.py").write_text("")
    (tmp_path / "chat" / "room" / "untested.py").write_text("")
    (tmp_path / "chat" / "__init__.py").write_text('"""Docstring only."""\n')
    (tmp_path / "tests" / "chat" / "room").mkdir(parents=True)
    (tmp_path / "tests" / "chat" / "room" / "test_tested.py").write_text("")
    assert missing_tests(tmp_path) == [
        "chat/room/__init__.py (code of its own: name its test module in PACKAGE_TESTS)",
        "chat/room/untested.py -> tests/chat/room/test_untested.py",
    ]
