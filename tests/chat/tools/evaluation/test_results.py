"""Exact match, records, and the results file: partial conversations are dropped, the rewrite is clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chat.tools.evaluation.results import ResultsFile, exact_match, normalize, read_results, turn_record


@pytest.mark.parametrize(
    ("reply", "reference", "match"),
    [
        ("  Paris\n", "paris", True),
        ("The  capital\tis\n Paris", "the capital is paris", True),
        ("STRASSE", "straße", True),  # casefold, not lower
        ("Paris.", "Paris", False),  # punctuation is not normalized
        ("Pa ris", "Paris", False),
    ],
)
def test_exact_match_normalization(reply, reference, match):
    assert exact_match(reply, [reference]) is match


def test_exact_match_without_reference_or_reply():
    assert exact_match("x", None) is None
    assert exact_match(None, ["x"]) is False
    assert exact_match("b", ["a", " B "]) is True
    assert normalize("  A \u00a0 B ") == "a b"


def test_error_record_shape():
    record = turn_record("c", 2, 1, 3, "stateful", references=("r",), error=("invalid_media", "no images"))
    assert record == {
        "id": "c", "line": 2, "turn": 1, "turns": 3, "mode": "stateful", "reply": None, "finish_reason": None,
        "usage": None, "timings": None, "reference": "r", "exact_match": False,
        "error": {"code": "invalid_media", "message": "no images"},
    }  # fmt: skip


def conversation(cid: str, turns: int) -> list[dict]:
    return [turn_record(cid, 1, i, turns, "stateful", error=("x", "y")) for i in range(turns)]


def test_partial_conversations_and_cut_lines_are_dropped_and_the_rewrite_is_clean(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    done_a, done_b, partial = conversation("a", 2), conversation("b", 1), conversation("c", 3)
    lines = [json.dumps(r) for r in [*done_a, *done_b, *partial[:2]]]
    path.write_text("\n".join(lines) + "\n" + json.dumps(partial[2])[:17], encoding="utf-8")  # killed mid-line
    resumed = read_results(path)
    assert resumed.finished == {"a": 2, "b": 1}
    assert resumed.records == [*done_a, *done_b]
    assert (resumed.dropped, resumed.unreadable) == (1, 1)  # conversation c, and the cut line
    results = ResultsFile.open(path, resumed.records, rewrite=True)
    results.write_conversation(partial)
    results.close()
    again = read_results(path)
    assert again.finished == {"a": 2, "b": 1, "c": 3} and again.dropped == again.unreadable == 0
    assert [json.loads(x) for x in path.read_text().splitlines()] == [*done_a, *done_b, *partial]
    assert not (tmp_path / "out.jsonl.tmp").exists()


def test_a_missing_file_is_an_empty_start(tmp_path: Path):
    resumed = read_results(tmp_path / "none.jsonl")
    assert (resumed.records, resumed.finished, resumed.dropped, resumed.unreadable) == ([], {}, 0, 0)
