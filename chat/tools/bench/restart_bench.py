"""`turncache bench restart`: what a restart costs a resumed conversation, with and without the disk tier.

Every server is its own process (``python -m chat.cli serve``), so that a kill is a real ``kill -9``:

1. a server with the disk tier holds a conversation of ``turns`` turns (default 10, ~2,000 tokens: ~60-token
   questions, greedy replies of up to 128 tokens) in a session. Once its disk writes are done, its cache directory
   is copied aside; then the next turn (the same question for every figure) is asked in stateless mode with the same
   messages: ``ttft_warm_ms`` (that turn without a restart) and the reference reply. The server is then killed
   (SIGKILL). The copy is what the kill left on disk, without the reference turn's own entry (which would make the
   resumed turn a mere repeat).
2. a server on the copied directory and the same sessions database: ``restart_s`` (from spawning the process to its
   first answer on ``/health``: imports, model load, disk index rebuild), then the session is resumed and the
   question asked as its next turn: ``ttft_after_restart_ms``, ``cached_ratio_after_restart`` (its cached tokens /
   ``prefix_tokens``, the tokens of the conversation before it: the previous turn's prompt and reply) and
   ``same_reply`` (its text equals the reference reply).
3. a server with the disk tier off (``--disk-budget 0``): the same turn in stateless mode: ``ttft_cold_ms``.

Times to first token are the server's own (``reply.done`` timings). Targets (issue 14): ``cached_ratio_after_restart``
>= 0.95, ``ttft_after_restart_ms`` <= 2 x ``ttft_warm_ms``, ``same_reply`` true.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import chat
from chat.tools.bench.report import emit

REPO_ROOT = Path(chat.__file__).resolve().parents[1]  # `python -m chat.cli` runs from here
TOPICS = (
    "how lighthouses work",
    "the water cycle",
    "why leaves change colour",
    "how a bicycle stays upright",
    "the invention of paper",
    "how glaciers move",
    "what makes bread rise",
    "how owls hunt at night",
    "why the moon has phases",
    "how a piano makes sound",
    "how coral reefs grow",
)


def question(turn: int) -> str:
    """About 60 tokens."""
    return (
        f"Question {turn + 1}: please explain {TOPICS[turn % len(TOPICS)]}. Give a clear answer with an example, "
        "describe each step in order, and finish with one fact that most people find surprising."
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``turncache serve`` in a child process, with its output in ``log_path``."""

    def __init__(self, model: str, *, cache_dir: Path, sessions_db: Path, log_path: Path, disk_budget: int | None):
        self.port = free_port()  # chosen before the start; another process could take it first (then start fails)
        self.args = [
            *("--model", model, "--port", str(self.port)),
            *("--cache-dir", str(cache_dir), "--sessions-db", str(sessions_db)),
            *(() if disk_budget is None else ("--disk-budget", str(disk_budget))),
        ]
        self.log_path = log_path  # the server's stdout and stderr
        self.proc: subprocess.Popen | None = None  # the running server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def start(self, timeout: float = 300.0) -> float:
        """Spawn the server; return the seconds until it answered ``/health``.

        Raises:
            RuntimeError: it exited, or did not answer within ``timeout`` seconds (its log is in the message).
        """
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chat.cli", "serve", *self.args],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the server did not start in {timeout} s:\n{self.log()[-3000:]}")

    def metrics(self) -> dict[str, float]:
        """The samples of ``/metrics``, by name with labels (``turncache_cache_bytes{tier="disk"}``)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_for_disk(self, timeout: float = 120.0) -> None:
        """Wait until the prefix cache has no file left to write.

        Raises:
            TimeoutError: it still had some after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while self.metrics().get("turncache_cache_disk_pending_writes", 0) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the prefix cache's disk writes did not finish")
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int:
        """A clean stop (SIGTERM, as from a service manager); returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """``kill -9``: nothing runs after it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def copy_cache_dir(source: Path, target: Path) -> None:
    """The files of a cache directory, as they are now (no temporary files)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.tmp"))


def run(model: str = "smollm2", *, turns: int = 10, reply_tokens: int = 128, workdir: Path | None = None) -> dict:
    """The figures of the module docstring, from one run (three server processes, one after another)."""
    from chat.tools.client import ChatClient

    with tempfile.TemporaryDirectory(prefix="turncache-restart-") as tmp:
        root = Path(workdir or tmp)
        db, live_dir, kept_dir = root / "sessions.sqlite3", root / "cache", root / "cache-at-kill"
        sampling = {"temperature": 0.0, "max_tokens": reply_tokens}
        system = "You are a helpful assistant."

        def server(name: str, cache_dir: Path, disk_budget: int | None = None) -> ServerProcess:
            return ServerProcess(
                model, cache_dir=cache_dir, sessions_db=db, log_path=root / f"{name}.log", disk_budget=disk_budget
            )

        first = server("first", live_dir)
        first.start()
        try:
            with ChatClient(first.ws_url) as client:
                session = client.create_session(system=system, sampling=sampling)
                last = None
                for turn in range(turns):
                    last = client.send(question(turn))
                history = [{"role": "system", "content": system}]
                history += [{"role": m.role, "content": m.content} for m in client.conversation().messages]
                first.wait_for_disk()
                copy_cache_dir(live_dir, kept_dir)
                disk_bytes = first.metrics().get('turncache_cache_bytes{tier="disk"}', 0.0)
                warm = client.complete([*history, {"role": "user", "content": question(turns)}], sampling=sampling)
        finally:
            first.kill()
        assert last is not None
        prefix_tokens = last.prompt_tokens + last.usage.completion_tokens

        second = server("restarted", kept_dir)
        restart_s = second.start()
        try:
            with ChatClient(second.ws_url) as client:
                client.resume_session(session.id)
                resumed = client.send(question(turns))
            reads = second.metrics().get("turncache_cache_disk_reads_total", 0.0)
        finally:
            second.kill()

        third = server("cold", root / "cache-off", disk_budget=0)
        third.start()
        try:
            with ChatClient(third.ws_url) as client:
                cold = client.complete([*history, {"role": "user", "content": question(turns)}], sampling=sampling)
        finally:
            third.kill()

    return {
        "model": model,
        "turns": turns,
        "prefix_tokens": prefix_tokens,
        "disk_bytes": int(disk_bytes),
        "restart_s": restart_s,
        "ttft_warm_ms": warm.timings.ttft_ms,
        "ttft_after_restart_ms": resumed.timings.ttft_ms,
        "ttft_cold_ms": cold.timings.ttft_ms,
        "ttft_after_restart_over_warm": resumed.timings.ttft_ms / warm.timings.ttft_ms,
        "cached_tokens_warm": warm.cached_tokens,
        "cached_tokens_after_restart": resumed.cached_tokens,
        "cached_ratio_after_restart": resumed.cached_tokens / prefix_tokens,
        "disk_reads_after_restart": int(reads),
        "same_reply": resumed.text == warm.text,
        "same_reply_cold": cold.text == warm.text,
    }


TARGETS: dict[str, tuple[str, Any]] = {
    "cached_ratio_after_restart": (">=", 0.95),
    "ttft_after_restart_over_warm": ("<=", 2.0),
    "same_reply": ("==", True),
}


def main(as_json: bool, model: str = "smollm2", turns: int = 10) -> int:
    result = run(model, turns=turns)
    emit(result, TARGETS, as_json)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(as_json="--json" in sys.argv))
