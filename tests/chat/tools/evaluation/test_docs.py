"""docs/eval.md stays true: its JSON examples are a valid dataset line and real record shapes, its tables list every
flag, record field and runner error code, and its Python example compiles."""

from __future__ import annotations

import json
import re
from pathlib import Path

from chat.cli import build_parser
from chat.tools.evaluation import runner
from chat.tools.evaluation.dataset import EvalConversation, parse_line
from chat.tools.evaluation.results import turn_record

DOC = (Path(__file__).parents[4] / "docs" / "eval.md").read_text()
RUNNER_CODES = {
    "invalid_dataset_line", "media_not_found", "media_encoding", "connect_failed", "connection_lost", "timeout",
    "unexpected_server_event", "eval_internal",
}  # fmt: skip


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, flags=re.M | re.S)


def first_cells(heading: str) -> set[str]:
    section = DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| `")}


def test_the_dataset_example_is_a_valid_line():
    example = blocks("json")[0]
    conversation = parse_line(json.dumps(json.loads(example)), 1)
    assert isinstance(conversation, EvalConversation), conversation
    assert [t.references for t in conversation.turns] == [("Paris",), ("red", "Red."), None]


def test_the_record_examples_have_exactly_the_record_fields():
    fields = set(turn_record("c", 1, 0, 1, "stateful"))
    for example in blocks("json")[1:]:
        assert set(json.loads(example)) == fields
    documented = {cell.strip("`") for cell in first_cells("The results file")}
    assert {name for cell in documented for name in cell.replace("`", "").split(", ")} == fields


def test_every_flag_is_documented():
    evaluate = build_parser()._subparsers._group_actions[0].choices["eval"]
    flags = {a.option_strings[0] for a in evaluate._actions if a.option_strings and a.dest != "help"}
    documented = {cell.strip("`") for cell in first_cells("Quick start")}
    assert flags | {"DATASET.jsonl"} == documented


def test_every_runner_error_code_is_documented_and_used():
    source = Path(runner.__file__).read_text()
    assert {cell.strip("`") for cell in first_cells("Errors")} == RUNNER_CODES
    for code in RUNNER_CODES:
        assert f'"{code}"' in source, code


def test_the_python_example_compiles():
    (example,) = blocks("python")
    compile(example, "docs/eval.md", "exec")
