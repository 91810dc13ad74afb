"""bench http's session clients (``chat.tools.bench.http_clients``) against a live server: in a process of their own
and in the calling thread, over HTTP and the WebSocket, each session's reply counted; a failure is an error of its
session, not an exception of the run."""

from __future__ import annotations

import json
import os
import threading

import pytest

from chat.tools.bench import http_clients
from chat.tools.bench.http_clients import ClientConfig, Served, run_apart, run_here
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

KEY = "sessions-key-0123456789abcdef"


@pytest.fixture(scope="module")
def server():
    runtime = FakeRuntime(script=lambda prompt: "word " * 100)
    engine, srv = make_server(runtime=runtime, api_keys=json.dumps({KEY: "sessions"}), keys_poll_s=0)
    with srv:
        yield srv
    engine.close()


def conversations(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"question {i}"}] for i in range(n)]


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("run", [run_apart, run_here], ids=["apart", "here"])
def test_every_session_is_counted_from_its_usage(server, transport, run):
    replies, wall, cpu = run(ClientConfig(transport, server.url, conversations(3), 7, KEY))
    assert replies == [Served(7, r.ttft_ms, None) for r in replies]
    assert all(r.ttft_ms is not None and 0 < r.ttft_ms <= wall * 1000 for r in replies)
    assert wall > 0 and cpu > 0


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_a_refused_session_is_its_error_not_the_runs(server, transport):
    replies, _, _ = run_apart(ClientConfig(transport, server.url, conversations(2), 7, "wrong-key-0123456789abcdef"))
    assert len(replies) == 2 and all(r.tokens == 0 and r.error for r in replies)


def test_the_clients_apart_run_in_another_process(server, monkeypatch):
    """The level's work happens in the child: this process runs none of the sessions (they would record it here)."""
    seen: list[tuple[int, int]] = []
    real = http_clients.http_session

    async def recording(*args, **kwargs):
        seen.append((os.getpid(), threading.get_ident()))
        return await real(*args, **kwargs)

    monkeypatch.setattr(http_clients, "http_session", recording)
    replies, _, _ = run_apart(ClientConfig("http", server.url, conversations(2), 7, KEY))
    assert [r.tokens for r in replies] == [7, 7] and seen == []
    replies, _, _ = run_here(ClientConfig("http", server.url, conversations(2), 7, KEY))
    assert [r.tokens for r in replies] == [7, 7] and seen == [(os.getpid(), threading.get_ident())] * 2
