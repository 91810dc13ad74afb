"""The bench's bad clients (``chat.tools.bench.bad_clients``) against a live server with short backpressure settings:
the slow reader gets the typed ``slow_client`` error or a closed connection, silent connections are closed after the
idle time, the flood past its tenant's limit gets 429s; and what a slow reader got is read off its bytes."""

from __future__ import annotations

import asyncio
import json

from chat.tools.bench import bad_clients
from chat.tools.bench.bad_clients import BadConfig, classify_stream
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

SLOW_KEY, FLOOD_KEY = "slow-key-0123456789abcdef", "flood-key-0123456789abcdef"


def test_the_bad_clients_get_typed_errors_closes_and_refusals_from_a_server_with_short_limits():
    keys = {SLOW_KEY: "slow", FLOOD_KEY: "flood", "tenants": {"flood": {"requests_per_minute": 2}}}
    runtime = FakeRuntime(script=lambda prompt: "word " * 400, delay_s=0.005)  # a long reply, a step every 5 ms
    engine, srv = make_server(
        runtime=runtime,
        api_keys=json.dumps(keys),
        keys_poll_s=0,
        stream_buffer_events=16,
        send_timeout_s=0.5,
        idle_connection_s=0.5,
        send_buffer_kib=16,  # else the kernel takes megabytes of the stream before a write waits
        refusal_hold_s=0,  # each of the flood's refusals at once (held ones: tests/chat/server/transport/test_guard.py)
    )
    with srv:
        cfg = BadConfig(
            "127.0.0.1", srv.port, SLOW_KEY, FLOOD_KEY, slow_readers=1, pause_s=2.0, slow_max_tokens=1500, silent=2,
            flood_rps=40.0, flood_connections=2,
        )  # fmt: skip
        out = asyncio.run(bad_clients.run(cfg, lambda: asyncio.sleep(1.5)))
    engine.close()
    slow = out.slow_reader
    assert slow["slow_client"] + slow["cut"] == 1 and slow["completed"] == slow["refused"] == slow["unfinished"] == 0
    assert out.silent["closed"] >= 2 and 0.4 < out.silent["longest_open_s"] < 1.5  # closed after ~0.5 s idle
    flood = out.flood
    assert flood["ok"] == 2 and flood["rate_limited"] > 10 and flood["other"] == 0
    assert flood["requests"] == flood["ok"] + flood["rate_limited"]


def test_what_a_slow_reader_got_is_read_off_its_bytes():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    error = b'data: {"error":{"message":"x","type":"slow_client_error","code":"slow_client"}}\n\ndata: [DONE]\n\n'
    assert classify_stream(head + b"data: {}\n\n" + error) == "slow_client"
    assert classify_stream(head + b"data: {}\n\ndata: [DONE]\n\n") == "completed"
    assert classify_stream(head + b"data: {}\n\n") == "cut"  # the connection closed before the stream's end
    assert classify_stream(b"HTTP/1.1 429 Too Many Requests\r\n\r\n{}") == "refused"
    assert classify_stream(b"") == "cut"
