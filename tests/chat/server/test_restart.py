"""A real server restarted (``kill -9``, then a clean stop): the resumed conversation's next turn is served from the
disk tier, with the same greedy reply as without a restart; a read-only cache directory leaves it serving from
memory and saying so (logs, ``/metrics``). Each server is a real process (``python -m chat.cli serve``).

The prefix a turn can reuse is the previous prompt plus as much of the previous reply as renders back to the tokens
that were generated; tiny-llama's replies are random tokens that mostly do not, so "its prefix" here is what the same
turn reuses on a server that was never restarted, and the test asks for all of it (>= 95% with the default model:
``turncache bench restart``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from chat.tools.bench.restart_bench import ServerProcess, copy_cache_dir
from chat.tools.client import ChatClient

pytestmark = pytest.mark.slow

SAMPLING = {"temperature": 0.0, "max_tokens": 12}
SYSTEM = "You are terse."
QUESTIONS = [f"Question {i}: what is {i} plus {i}? Explain the steps." for i in range(1, 7)]


def history(client: ChatClient) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": m.role, "content": m.content} for m in client.conversation().messages
    ]


def after(messages: list[dict], *turns: tuple[str, str]) -> list[dict]:
    out = list(messages)
    for q, a in turns:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out


def read_only(path: Path):
    """Make ``path`` refuse new files, even for root (``chattr +i``); returns the undo. Skips when impossible."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return lambda: path.chmod(0o755)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a directory read-only for root here (no chattr)")
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_resumed_conversation_hits_after_kill_9_and_after_a_clean_stop(tmp_path):
    db, live, kept = tmp_path / "sessions.sqlite3", tmp_path / "cache", tmp_path / "cache-at-kill"

    def server(name: str, cache_dir: Path) -> ServerProcess:
        return ServerProcess(
            "tiny-llama", cache_dir=cache_dir, sessions_db=db, log_path=tmp_path / f"{name}.log", disk_budget=None
        )

    # 1. three turns; the files on disk once the writes are done are what a kill -9 leaves: keep a copy of them.
    #    Then, on the same live server, the reference replies of turns 4 and 5 without any restart.
    first = server("first", live)
    first.start()
    try:
        with ChatClient(first.ws_url) as client:
            session = client.create_session(system=SYSTEM, sampling=SAMPLING)
            third = [client.send(q) for q in QUESTIONS[:3]][-1]
            messages = history(client)
            first.wait_for_disk()
            copy_cache_dir(live, kept)
            warm4 = client.complete([*messages, {"role": "user", "content": QUESTIONS[3]}], sampling=SAMPLING)
            with_4 = after(messages, (QUESTIONS[3], warm4.text))
            warm5 = client.complete([*with_4, {"role": "user", "content": QUESTIONS[4]}], sampling=SAMPLING)
    finally:
        first.kill()

    # 2. after kill -9: resume, turn 4; then a clean stop right away (its files are written at shutdown).
    second = server("after-kill", kept)
    second.start()
    try:
        with ChatClient(second.ws_url) as client:
            client.resume_session(session.id)
            fourth = client.send(QUESTIONS[3])
        assert warm4.cached_tokens >= third.prompt_tokens
        assert fourth.cached_tokens == warm4.cached_tokens and fourth.text == warm4.text
        assert second.metrics()["turncache_cache_disk_reads_total"] >= 1
        assert second.stop() == 0
    finally:
        second.kill()
    assert "disk tier flushed at shutdown" in second.log()

    # 3. after the clean stop: resume, turn 5; then the cache directory turns read-only: turn 6 is still answered.
    last = server("after-stop", kept)
    last.start()
    undo = None
    try:
        with ChatClient(last.ws_url) as client:
            client.resume_session(session.id)
            fifth = client.send(QUESTIONS[4])
            assert warm5.cached_tokens >= fourth.prompt_tokens
            assert fifth.cached_tokens == warm5.cached_tokens and fifth.text == warm5.text
            undo = read_only(kept / "v1" / "entries")
            sixth = client.send(QUESTIONS[5])
        assert sixth.finish_reason in ("stop", "length") and sixth.cached_tokens > 0
        last.wait_for_disk()
        metrics = last.metrics()
        assert metrics["turncache_cache_disk_healthy"] == 0 and metrics["turncache_cache_disk_write_errors_total"] >= 1
        assert "cannot write to" in last.log()
    finally:
        if undo is not None:
            undo()
        last.kill()
