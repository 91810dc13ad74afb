"""The dataset format: good lines become conversations, bad lines become BadLine records, never exceptions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chat.tools.evaluation.dataset import (
    BadLine,
    EvalConversation,
    load_dataset,
    missing_media,
    parse_line,
    turn_content,
)


def line(**fields) -> str:
    return json.dumps({"id": "c", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_turns_references_system_and_sampling():
    conv = parse_line(
        line(
            system="sys",
            sampling={"max_tokens": 8, "stop": "x"},
            messages=[
                {"role": "user", "content": "a"},
                {"role": "assistant", "reference": "A"},
                {"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "image", "path": "i.png"}]},
                {"role": "user", "content": "c"},
                {"role": "assistant", "reference": ["C", "see"]},
                {"role": "user", "content": "d"},
                {"role": "assistant"},
            ],
        ),
        3,
    )
    assert isinstance(conv, EvalConversation) and conv.line == 3 and conv.system == "sys"
    assert conv.sampling == {"max_tokens": 8, "stop": ["x"]}  # only what the dataset gave
    assert [t.index for t in conv.turns] == [0, 1, 2, 3]
    assert [t.references for t in conv.turns] == [("A",), None, ("C", "see"), None]


@pytest.mark.parametrize(
    ("text", "expected_id", "message"),
    [
        ("{not json", "@line1", "not valid JSON"),
        ("[1, 2]", "@line1", "valid dictionary"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}), "@line1", "id: Field required"),
        (json.dumps({"id": "c"}), "c", "messages: Field required"),
        (line(messages=[]), "c", "messages: List should have at least 1 item"),
        (line(messages=[{"role": "assistant", "reference": "x"}]), "c", "must follow a user message"),
        (line(messages=[{"role": "user", "content": 5}]), "c", "messages.0.content: content must be a string"),
        (line(messages=[{"role": "user", "content": [{"type": "image"}]}]), "c", "messages.0.content.0.path"),
        (line(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), "c", "messages.0.content.0.text"),
        (line(messages=[{"role": "assistant", "content": "x"}]), "c", "messages.0.content: Extra inputs"),
        (line(messages=[{"role": "system", "content": "x"}]), "c", "messages.0"),
        (line(sampling={"temperature": 9}), "c", "sampling.temperature"),
        (line(extra=1), "c", "extra: Extra inputs are not permitted"),
        (json.dumps({"id": 7, "messages": []}), "@line1", "id: Input should be a valid string"),
    ],
)
def test_bad_lines_say_what_is_wrong(text, expected_id, message):
    entry = parse_line(text, 1)
    assert isinstance(entry, BadLine) and entry.id == expected_id and entry.line == 1
    assert message in entry.error, entry.error


def test_load_skips_blank_lines_and_reports_duplicate_ids(tmp_path: Path):
    path = tmp_path / "d.jsonl"
    path.write_text(f"{line()}\n\n   \n{line()}\n{{oops\n", encoding="utf-8")
    entries = load_dataset(path)
    assert [(type(e).__name__, e.id, e.line) for e in entries] == [
        ("EvalConversation", "c", 1),
        ("BadLine", "c@line4", 4),
        ("BadLine", "@line5", 5),
    ]
    assert "duplicate id (first on line 1)" in entries[1].error


def test_media_paths_resolve_against_the_dataset_directory(tmp_path: Path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8)
    conv = parse_line(
        line(
            messages=[
                {"role": "user", "content": [{"type": "image", "path": "img/a.png"}, {"type": "text", "text": "t"}]},
                {"role": "user", "content": [{"type": "audio", "path": "gone.wav"}]},
            ]
        ),
        1,
    )
    assert missing_media(conv, tmp_path) == [tmp_path / "gone.wav"]
    image, text = turn_content(conv.turns[0], tmp_path)
    assert image["image_url"]["url"].startswith("data:image/png;base64,") and text == {"type": "text", "text": "t"}
