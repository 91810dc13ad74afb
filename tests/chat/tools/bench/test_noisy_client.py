"""bench tenants' noisy tenant in a child process: its protocol over the pipes, 429s honoured, a child that dies."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from chat.server.runner import BackgroundServer
from chat.tools.bench.noisy_client import NOISY_KEY, NoisyChild, NoisyPlan, noisy_system


def stub_server(seen: list[dict]) -> FastAPI:
    """Answers every other request 429 (Retry-After 0) and the rest with a one-token reply; records each request's
    body and key."""
    app = FastAPI()
    calls = [0]

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        calls[0] += 1
        seen.append({"body": body, "auth": request.headers.get("authorization")})
        if calls[0] % 2:
            return JSONResponse({"error": {"code": "rate_limited"}}, status_code=429, headers={"retry-after": "0"})
        usage = {"prompt_tokens": 10, "completion_tokens": 1}
        return {"choices": [{"message": {"content": "ok"}}], "usage": usage}

    return app


async def run_child(plan: NoisyPlan, turns: int):
    async with NoisyChild(plan) as child:
        await child.wait_for_turns(turns)
        return child._process.pid, await child.stop()


def test_the_workers_run_in_a_child_process_honour_429s_and_report_their_tally():
    seen: list[dict] = []
    with BackgroundServer(stub_server(seen)) as server:
        plan = NoisyPlan(server.url, [["first question", "second question"]], workers=2, reply_tokens=3, row_align=4)
        pid, tally = asyncio.run(run_child(plan, 6))
    assert pid != os.getpid()
    assert tally.turns >= 6 and tally.rate_limited >= tally.turns - 2 and tally.errors == 0  # each 429 sent again
    assert tally.completion_tokens == tally.turns and tally.conversations >= 2
    assert tally.kv_rows == 12 * tally.conversations  # 10 + 1 tokens in rows of 4
    first = seen[0]["body"]
    assert first["max_tokens"] == 3 and first["messages"][0]["content"] in (noisy_system(0), noisy_system(1))
    assert {s["auth"] for s in seen} == {f"Bearer {NOISY_KEY}"}
    assert all(s["body"]["messages"][-1]["content"].endswith("question") for s in seen)


def test_a_child_that_ends_without_its_tally_is_an_error(monkeypatch):
    monkeypatch.setattr(NoisyChild, "command", (sys.executable, "-c", "import sys; sys.exit(3)"))
    plan = NoisyPlan("http://127.0.0.1:9", [["q"]], workers=1, reply_tokens=1, row_align=1)
    with pytest.raises(RuntimeError, match=r"ended \(3\) without its tally"):
        asyncio.run(run_child(plan, 1))
