"""bench tenants' noisy tenant (B): eval workers over HTTP, in a process of their own.

B's workers are HTTP clients of the server under test; run in the server's process they would take the GIL from the
engine's worker and the server's event loop for their own JSON and retries, so the benchmark would measure its own
client too. :func:`run_child` starts them with ``python -m chat.tools.bench.noisy_client`` and talks to the child
over its pipes, one JSON object a line:

- parent -> child (stdin): the :class:`NoisyPlan`; later any line (or the end of stdin) means stop.
- child -> parent (stdout): ``{"turns": N}`` after each answered request (the parent waits for B's steady state
  with it), then the final ``{"tally": {...}}`` (:class:`NoisyTally`). Nothing else is written to stdout.

The workers themselves (:func:`noisy_worker`) are plain asyncio and work in any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

NOISY_KEY = "noisy-tenant-bench-key-0001"  # tenant "noisy" (B) in bench tenants' keys file
NOISY_SYSTEM = "You are graded on an evaluation set. Read each passage and summarize it in one sentence."


@dataclass(frozen=True)
class NoisyPlan:
    """What B's workers run (bench tenants' ``noisy_*`` settings and the server)."""

    url: str  # the server's base URL
    texts: list[list[str]]  # the user messages of each of the first ``workers`` conversations
    workers: int  # eval workers, at once
    reply_tokens: int  # max_tokens of each request
    row_align: int  # the engine's K/V buffers hold whole multiples of this many rows (chat.models.kv_rows)


@dataclass
class NoisyTally:
    """What B's workers did."""

    turns: int = 0  # requests answered 200
    conversations: int = 0  # conversations finished
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rate_limited: int = 0  # 429s
    errors: int = 0  # other failures
    error_samples: list[str] = field(default_factory=list)
    kv_rows: int = 0  # K/V rows (held_rows) of each finished conversation's whole sequence

    def fail(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what[:300])


def noisy_system(conversation: int) -> str:
    return f"[eval item {conversation}] {NOISY_SYSTEM}"


def held_rows(tokens: int, row_align: int) -> int:
    """The fewest K/V buffer rows a sequence of ``tokens`` tokens is held in (a whole multiple of ``row_align``)."""
    return -(-tokens // row_align) * row_align


async def noisy_request(client, messages: list[dict], plan: NoisyPlan, tally: NoisyTally, stop) -> dict | None:
    """B's request answered 200, its body; None when it failed (counted) or the run is over. A 429 is counted and
    sent again after its Retry-After."""
    body = {"messages": messages, "max_tokens": plan.reply_tokens, "temperature": 0.0}
    headers = {"authorization": f"Bearer {NOISY_KEY}"}
    while not stop.is_set():
        try:
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
        except Exception as exc:
            tally.fail(f"{type(exc).__name__}: {exc}")
            return None
        if response.status_code == 429:
            tally.rate_limited += 1
            wait = float(response.headers.get("retry-after", "1"))
            with contextlib.suppress(TimeoutError):  # Retry-After honoured, unless the run ends first
                await asyncio.wait_for(stop.wait(), wait)
            continue
        if response.status_code != 200:
            tally.fail(f"HTTP {response.status_code}: {response.text}")
            return None
        return response.json()
    return None


async def noisy_worker(client, plan: NoisyPlan, worker: int, tally: NoisyTally, stop, on_turn: Callable) -> None:
    """Eval conversations back to back until ``stop`` is set: conversation ``worker``, then ``worker + workers``, ...
    (each with its own system tag, the user messages of ``texts[conversation % len(texts)]``). ``on_turn()`` after
    each answered request."""
    conversation = worker
    while not stop.is_set():
        messages = [{"role": "system", "content": noisy_system(conversation)}]
        for text in plan.texts[conversation % len(plan.texts)]:
            messages.append({"role": "user", "content": text})
            reply = await noisy_request(client, messages, plan, tally, stop)
            if reply is None:
                break
            usage = reply["usage"]
            tally.turns += 1
            tally.prompt_tokens += usage["prompt_tokens"]
            tally.completion_tokens += usage["completion_tokens"]
            on_turn()
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""})
        else:
            tally.conversations += 1
            tally.kv_rows += held_rows(usage["prompt_tokens"] + usage["completion_tokens"], plan.row_align)
        conversation += plan.workers


async def run_workers(plan: NoisyPlan, stop: asyncio.Event, on_turn: Callable) -> NoisyTally:
    """Every worker of ``plan`` until ``stop`` is set; what they did."""
    import httpx

    tally = NoisyTally()
    limits = httpx.Limits(max_connections=plan.workers + 4)
    async with httpx.AsyncClient(base_url=plan.url, timeout=600, limits=limits) as client:
        workers = [noisy_worker(client, plan, w, tally, stop, lambda: on_turn(tally)) for w in range(plan.workers)]
        await asyncio.gather(*workers)
    return tally


# ---------------------------------------------------------------- the child process


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _child() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    plan = NoisyPlan(**json.loads(await reader.readline()))
    stop = asyncio.Event()

    async def wait_for_stop() -> None:
        await reader.readline()  # any line, or the end of stdin
        stop.set()

    watcher = asyncio.create_task(wait_for_stop())
    tally = await run_workers(plan, stop, lambda t: _send({"turns": t.turns}))
    watcher.cancel()
    _send({"tally": asdict(tally)})


class NoisyChild:
    """B's workers in a child process (see the module docstring). Use as an async context manager; :meth:`stop`
    returns the tally."""

    command = (sys.executable, "-m", "chat.tools.bench.noisy_client")  # the child (tests give another)

    def __init__(self, plan: NoisyPlan) -> None:
        self.plan = plan
        self.turns = 0  # requests answered so far, as the child reported
        self._process: asyncio.subprocess.Process | None = None
        self._tally: asyncio.Future[NoisyTally] | None = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> NoisyChild:
        import chat

        self._process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=Path(chat.__file__).resolve().parent.parent,  # the same turncache as this process's
        )
        self._tally = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        await self._tell((json.dumps(asdict(self.plan)) + "\n").encode())
        return self

    async def _tell(self, line: bytes) -> None:
        """Write to the child's stdin; a child that has ended is reported by :meth:`stop` (it left no tally)."""
        assert self._process is not None and self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._process.stdin.write(line)
            await self._process.stdin.drain()

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None and self._tally is not None
        async for line in self._process.stdout:
            message = json.loads(line)
            if "turns" in message:
                self.turns = message["turns"]
            elif "tally" in message:
                self._tally.set_result(NoisyTally(**message["tally"]))
        if not self._tally.done():
            code = await self._process.wait()
            self._tally.set_exception(RuntimeError(f"the noisy tenant's process ended ({code}) without its tally"))

    async def wait_for_turns(self, turns: int) -> None:
        """Until the child has had ``turns`` requests answered (or has ended)."""
        assert self._tally is not None
        while self.turns < turns and not self._tally.done():
            await asyncio.sleep(0.05)

    async def stop(self) -> NoisyTally:
        """Tell the workers to stop (each ends with its request in flight); their tally.

        Raises:
            RuntimeError: the child ended without its tally (its exit status in the message).
        """
        assert self._tally is not None
        await self._tell(b"stop\n")
        return await self._tally

    async def __aexit__(self, *exc) -> None:
        assert self._process is not None
        if self._process.returncode is None and self._process.stdin is not None:
            self._process.stdin.close()
        try:
            await asyncio.wait_for(self._process.wait(), 30)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()
        if self._reader is not None:
            await self._reader


if __name__ == "__main__":
    asyncio.run(_child())
