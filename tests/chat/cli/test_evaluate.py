"""`turncache eval` (chat/cli/evaluate.py): its arguments, and a run against a server that is down. The runner
itself: tests/chat/tools/evaluation."""

import json

import pytest

from chat.cli import main


def test_eval_needs_a_dataset(capsys):
    with pytest.raises(SystemExit) as usage:
        main(["eval"])
    assert usage.value.code == 2 and "DATASET.jsonl" in capsys.readouterr().err


def test_eval_refuses_unusable_arguments_with_status_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["eval", str(dataset), "--url", "http://127.0.0.1:1/"]) == 2
    assert main(["eval", str(dataset), "--concurrency", "0"]) == 2


def test_eval_against_a_server_that_is_down_completes_with_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["eval", str(dataset), "--url", "ws://127.0.0.1:1/v1/ws", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["errors"] == 1 and summary["error_codes"] == {"connect_failed": 1}
    assert (tmp_path / "d.stateful.results.jsonl").is_file()  # the default --out
