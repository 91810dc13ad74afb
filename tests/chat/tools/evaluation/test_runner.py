"""chat/tools/evaluation/runner.py: `turncache eval` end to end on a loopback server with the fake engine: results,
summary, resume, bad input."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile
from PIL import Image

from chat.cli import main as cli_main
from chat.tools.evaluation import EvalOptions, EvalUsageError, run_eval
from tests.chat.tools.client.helpers import drop_on_turn, fake_server, free_port, scripted_server, session_created

REPO = Path(__file__).resolve().parents[4]


def user(content) -> dict:
    return {"role": "user", "content": content}


def ref(reference) -> dict:
    return {"role": "assistant", "reference": reference}


def write_dataset(path: Path, conversations: list[dict | str]) -> Path:
    lines = [c if isinstance(c, str) else json.dumps(c) for c in conversations]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def options(dataset: Path, url: str, out: Path, **kw) -> EvalOptions:
    return EvalOptions(dataset=dataset, url=url, out=out, progress=False, timeout=30, **kw)


@pytest.fixture
def media_dataset(tmp_path: Path) -> Path:
    (tmp_path / "media").mkdir()
    Image.new("RGB", (4, 4), "red").save(tmp_path / "media" / "red.png")
    buf = io.BytesIO()
    soundfile.write(buf, [0.0] * 800, 8000, format="WAV")
    (tmp_path / "media" / "tone.wav").write_bytes(buf.getvalue())
    return write_dataset(
        tmp_path / "data.jsonl",
        [
            {"id": "capitals", "system": "One word.", "sampling": {"max_tokens": 16},
             "messages": [user("Capital of France?"), ref("  PARIS "), user("And of Italy?"), ref("Rome")]},
            {"id": "picture", "messages": [user([{"type": "text", "text": "Colour?"},
                                                 {"type": "image", "path": "media/red.png"}]), ref("red"),
                                           user("And now?")]},
            {"id": "sound", "messages": [user([{"type": "audio", "path": "media/tone.wav"}])]},
            {"id": "chat", "messages": [user("hi"), user("more"), user("again")]},
        ],
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["stateful", "stateless"])
def test_results_summary_and_exact_match(media_dataset: Path, tmp_path: Path, mode: str):
    with fake_server() as (engine, url):
        engine.runtime.script = lambda prompt: "Paris"
        run = run_eval(options(media_dataset, url, tmp_path / "out.jsonl", mode=mode, concurrency=3))
    records = records_of(tmp_path / "out.jsonl")
    by_key = {(r["id"], r["turn"]): r for r in records}
    assert len(records) == len(by_key) == 8 and {r["mode"] for r in records} == {mode}
    assert sorted(by_key) == sorted(
        [("capitals", 0), ("capitals", 1), ("picture", 0), ("picture", 1), ("sound", 0), ("chat", 0), ("chat", 1),
         ("chat", 2)]
    )  # fmt: skip
    first = by_key[("capitals", 0)]
    assert first["reply"] == "Paris" and first["exact_match"] is True and first["reference"] == "  PARIS "
    assert first["usage"]["prompt_tokens"] > 0 and first["timings"]["ttft_ms"] > 0 and first["error"] is None
    assert by_key[("capitals", 1)]["exact_match"] is False
    assert by_key[("picture", 0)]["error"]["code"] == "invalid_media" and by_key[("picture", 0)]["reply"] is None
    assert by_key[("picture", 0)]["exact_match"] is False
    assert by_key[("picture", 1)]["reply"] == "Paris"  # the run goes on after a failed turn
    assert by_key[("sound", 0)]["error"]["code"] == "invalid_media"
    chat = [by_key[("chat", i)]["usage"] for i in range(3)]
    assert chat[0]["cached_tokens"] < chat[1]["cached_tokens"] < chat[2]["cached_tokens"]
    s = run.summary
    assert (run.ran, run.skipped, s.conversations, s.conversations_with_errors) == (4, 0, 4, 2)
    assert (s.turns, s.errors, s.error_codes) == (8, 2, {"invalid_media": 2})
    assert (s.references, s.exact_matches) == (3, 1) and s.exact_match_rate == pytest.approx(1 / 3)
    assert 0 < s.cached_ratio < s.cached_ratio_later < 1
    assert 0 < s.ttft_p50_ms <= s.ttft_p95_ms


def test_stateless_history_holds_the_models_own_replies_and_skips_failed_turns(tmp_path: Path):
    def respond(event):
        n = len(event["messages"])
        if any(isinstance(m["content"], list) for m in event["messages"][-1:]):
            return [{"type": "error", "reply_to": event["event_id"], "code": "invalid_media", "message": "no"}]
        done = {"type": "reply.done", "reply_to": event["event_id"], "turn_id": f"turn_{n}", "text": f"reply to {n}",
                "finish_reason": "stop", "timings": {"ttft_ms": 1.0},
                "usage": {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1,
                          "prompt_tokens_details": {"cached_tokens": 0}}}  # fmt: skip
        return [{"type": "turn.started", "reply_to": event["event_id"], "turn_id": f"turn_{n}", "kind": "completion"},
                {"type": "reply.delta", "reply_to": event["event_id"], "turn_id": f"turn_{n}", "delta": done["text"]},
                done]  # fmt: skip

    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8)
    dataset = write_dataset(
        tmp_path / "d.jsonl",
        [{"id": "c", "system": "sys", "messages": [user("one"), user([{"type": "image", "path": "a.png"}]),
                                                   user("three")]}],
    )  # fmt: skip
    with scripted_server(respond) as (url, frames):
        run_eval(options(dataset, url, tmp_path / "out.jsonl", mode="stateless"))
    assert [f["type"] for f in frames] == ["completion.create"] * 3
    assert frames[2]["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "reply to 2"},
        {"role": "user", "content": "three"},
    ]
    assert [r["error"] and r["error"]["code"] for r in records_of(tmp_path / "out.jsonl")] == [
        None,
        "invalid_media",
        None,
    ]


def test_resume_skips_finished_conversations_and_redoes_a_partial_one(media_dataset: Path, tmp_path: Path):
    out = tmp_path / "out.jsonl"
    with fake_server() as (engine, url):
        first = run_eval(options(media_dataset, url, out))
        turns_first = engine.metrics.turns
        lines = out.read_text(encoding="utf-8").splitlines()
        last_id = json.loads(lines[-1])["id"]
        cut = [i for i, line in enumerate(lines) if json.loads(line)["id"] == last_id]
        kept = [*lines[: cut[-1]], lines[cut[-1]][:25]]  # the last conversation's last line cut mid-way
        out.write_text("\n".join(kept), encoding="utf-8")
        second = run_eval(options(media_dataset, url, out))
        redone_turns = engine.metrics.turns - turns_first
        third = run_eval(options(media_dataset, url, out))
    assert (second.ran, second.skipped, second.dropped) == (1, 3, 1)
    assert redone_turns <= len(cut)  # only the partial conversation ran again (its media turns never reach it)
    assert (third.ran, third.skipped) == (0, 4)
    records = records_of(out)  # every line parses
    assert len(records) == len({(r["id"], r["turn"]) for r in records}) == 8
    counts = ("conversations", "conversations_with_errors", "turns", "errors", "error_codes", "references")
    assert [getattr(second.summary, k) for k in counts] == [getattr(first.summary, k) for k in counts]


def test_a_killed_run_resumes_to_a_complete_file(tmp_path: Path):
    dataset = write_dataset(
        tmp_path / "d.jsonl", [{"id": f"c{i}", "messages": [user(f"q{i}"), user("again")]} for i in range(6)]
    )
    out = tmp_path / "out.jsonl"
    with fake_server() as (engine, url):
        engine.runtime.script = lambda prompt: "word " * 4  # 20 tokens: ~0.2 s a turn
        engine.runtime.delay_s = 0.01
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "chat.cli", "eval", str(dataset), "--url", url, "--out", str(out)]
        child = subprocess.Popen([*argv, "--concurrency", "1", "--no-progress"], env=env, cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not out.exists() or out.stat().st_size == 0):
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        written = len({r["id"] for r in records_of(out)})
        assert 1 <= written < 6
        run = run_eval(options(dataset, url, out, concurrency=2))
    assert run.skipped >= written - 1 and run.ran + run.skipped == 6
    records = records_of(out)
    assert len(records) == len({(r["id"], r["turn"]) for r in records}) == 12
    assert run.summary.errors == 0 and run.summary.turns == 12


def test_bad_lines_and_missing_media_are_reported_and_the_run_goes_on(tmp_path: Path):
    good = {"id": "good", "messages": [user("hi")]}
    dataset = write_dataset(
        tmp_path / "d.jsonl",
        [
            good,
            "{this is not json",
            json.dumps({"id": "no-messages"}),
            json.dumps(good),
            {"id": "lost", "messages": [user([{"type": "image", "path": "nope/gone.png"}]), ref("x"), user("t")]},
            {"id": "last", "messages": [user("bye")]},
        ],
    )
    with fake_server() as (_, url):
        run = run_eval(options(dataset, url, tmp_path / "out.jsonl"))
    by_id = {}
    for r in records_of(tmp_path / "out.jsonl"):
        by_id.setdefault(r["id"], []).append(r)
    assert set(by_id) == {"good", "@line2", "no-messages", "good@line4", "lost", "last"}
    assert by_id["good"][0]["error"] is None and by_id["last"][0]["error"] is None
    for cid in ("@line2", "no-messages", "good@line4"):
        assert [r["error"]["code"] for r in by_id[cid]] == ["invalid_dataset_line"]
    assert "messages: Field required" in by_id["no-messages"][0]["error"]["message"]
    assert [r["error"]["code"] for r in by_id["lost"]] == ["media_not_found", "media_not_found"]
    assert "nope/gone.png" in by_id["lost"][0]["error"]["message"]
    assert run.summary.conversations == 6 and run.summary.conversations_with_errors == 4
    assert run.summary.error_codes == {"invalid_dataset_line": 3, "media_not_found": 2}


def test_a_server_that_is_down_gives_errors_per_conversation(media_dataset: Path, tmp_path: Path):
    url = f"ws://127.0.0.1:{free_port()}/v1/ws"
    run = run_eval(options(media_dataset, url, tmp_path / "out.jsonl"))
    records = records_of(tmp_path / "out.jsonl")
    assert len(records) == 8 and {r["error"]["code"] for r in records} == {"connect_failed"}
    assert run.summary.conversations_with_errors == 4 and run.summary.exact_match_rate == 0.0
    again = run_eval(options(media_dataset, url, tmp_path / "out.jsonl", retry_errors=True))
    assert again.ran == 4 and len(records_of(tmp_path / "out.jsonl")) == 8


def test_a_dropped_connection_fails_the_rest_of_that_conversation(media_dataset: Path, tmp_path: Path):
    with scripted_server(drop_on_turn) as (url, _):
        run = run_eval(options(media_dataset, url, tmp_path / "out.jsonl", concurrency=2))
    codes = {r["error"]["code"] for r in records_of(tmp_path / "out.jsonl")}
    assert codes == {"connection_lost"} and run.summary.errors == 8


def test_a_refused_session_fails_the_conversation(tmp_path: Path):
    def refuse(event):
        return [{"type": "error", "reply_to": event["event_id"], "code": "busy", "message": "full"}]

    dataset = write_dataset(tmp_path / "d.jsonl", [{"id": "c", "messages": [user("a"), user("b")]}])
    with scripted_server(refuse) as (url, _):
        run_eval(options(dataset, url, tmp_path / "out.jsonl"))
    assert [r["error"] for r in records_of(tmp_path / "out.jsonl")] == [{"code": "busy", "message": "full"}] * 2
    assert session_created({"event_id": "x"})[0]["reply_to"] == "x"


def test_unusable_arguments_raise_before_anything_is_written(media_dataset: Path, tmp_path: Path):
    out = tmp_path / "out.jsonl"
    url = "ws://127.0.0.1:1/v1/ws"
    for bad in (
        options(tmp_path / "missing.jsonl", url, out),
        options(media_dataset, "http://127.0.0.1:1/", out),
        options(media_dataset, url, out, concurrency=0),
        options(media_dataset, url, media_dataset),
        options(media_dataset, url, tmp_path),
    ):
        with pytest.raises(EvalUsageError):
            run_eval(bad)
    assert not out.exists()
    run_eval(options(media_dataset, url, out))
    with pytest.raises(EvalUsageError, match="holds stateful results"):
        run_eval(options(media_dataset, url, out, mode="stateless"))


def test_the_command_prints_the_summary_and_exits_0(media_dataset: Path, tmp_path: Path, capsys):
    with fake_server() as (_, url):
        argv = ["eval", str(media_dataset), "--url", url, "--out", str(tmp_path / "o.jsonl"), "--no-progress"]
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert "exact match" in out and "invalid_media 2" in out and "ttft p50 / p95 ms" in out
        assert cli_main([*argv, "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
    assert summary["ran"] == 0 and summary["skipped"] == 4 and summary["turns"] == 8 and summary["errors"] == 2
    assert cli_main(["eval", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_bug_in_one_conversation_does_not_stop_the_others(tmp_path: Path, monkeypatch):
    from chat.tools.evaluation import runner

    real = runner.run_conversation

    async def flaky(entry, options, base):
        if entry.id == "bad":
            raise RuntimeError("boom")
        return await real(entry, options, base)

    monkeypatch.setattr(runner, "run_conversation", flaky)
    dataset = write_dataset(
        tmp_path / "d.jsonl", [{"id": i, "messages": [user("a"), user("b")]} for i in ("ok", "bad")]
    )
    with fake_server() as (_, url):
        run = run_eval(options(dataset, url, tmp_path / "out.jsonl"))
    assert run.summary.error_codes == {"eval_internal": 2} and run.summary.turns == 4
