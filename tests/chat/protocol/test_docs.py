"""docs/protocol.md stays true: its JSON examples are valid events, its tables list every code and limit, and its
Python client works against a server made of the protocol layer and a fake engine."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from websockets.sync.server import ServerConnection, serve

from chat.protocol import (
    CLIENT_EVENT_TYPES,
    SERVER_EVENT_TYPES,
    Connection,
    ErrorCode,
    InMemorySessionStore,
    ProtocolError,
    Timings,
    Usage,
    parse_client_event,
    parse_server_event,
    serialize_server_event,
)
from chat.protocol import limits as L
from chat.protocol.store import MAX_SESSIONS

DOC = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, flags=re.M | re.S)


def table_rows(heading: str) -> dict[str, str]:
    section = DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip().split("`")[1]: "|".join(cells[1:]) for cells in rows}


def test_every_json_example_is_a_valid_event_and_every_event_has_one():
    seen = set()
    for block in blocks("json"):
        try:
            event = parse_client_event(block)
        except ProtocolError as exc:
            assert exc.code is ErrorCode.UNKNOWN_EVENT, f"{exc} in\n{block}"
            event = parse_server_event(block)
        seen.add(event.type)
    assert seen == set(CLIENT_EVENT_TYPES) | set(SERVER_EVENT_TYPES)


def test_the_error_table_lists_every_code():
    assert set(table_rows("Error codes")) == {code.value for code in ErrorCode}


def test_the_limits_table_lists_every_limit_with_its_value():
    rows = table_rows("Limits")
    constants = {name: value for name, value in vars(L).items() if name.startswith("MAX_")}
    assert set(rows) == set(constants) | {"MAX_SESSIONS"}
    constants["MAX_SESSIONS"] = MAX_SESSIONS
    for name, value in constants.items():
        shown = "2^63 − 1" if value == 2**63 - 1 else f"{value:,}"
        assert shown in rows[name], (name, rows[name])


def fake_server(ws: ServerConnection) -> None:
    """The protocol layer plus an engine that always answers "Paris." with 20 prompt tokens, 12 of them cached."""
    conn = Connection(InMemorySessionStore(), models=["test-model"])
    for frame in ws:
        step = conn.receive(frame)
        events = list(step.send)
        if step.start is not None:
            turn_id = step.start.turn_id
            events += [conn.on_delta(turn_id, "Par"), conn.on_delta(turn_id, "is.")]
            events += conn.on_done(turn_id, "Paris.", "stop", Usage.of(20, 3, 12), Timings(ttft_ms=5.0, total_ms=9.0))
        for event in events:
            ws.send(serialize_server_event(event))


@pytest.mark.timeout(30)
def test_the_python_client_runs(capsys):
    [client] = [b for b in blocks("python") if "websockets.connect" in b]
    assert 15 <= len([line for line in client.splitlines() if line.strip()]) <= 30  # "about 20 lines"
    with serve(fake_server, "127.0.0.1", 0) as server:
        port = server.socket.getsockname()[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        exec(client.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), {"__name__": "docs_client"})
        server.shutdown()
    out = capsys.readouterr().out
    assert "'model': 'test-model'" in out
    assert "Paris.\n[stop] 20 prompt tokens (12 cached), 3 completion tokens, first token after 5.0 ms" in out


def test_the_error_table_gives_the_http_status_of_the_servers_one_table():
    from chat.server.errors import TRANSPORT

    rows = table_rows("Error codes")
    assert set(TRANSPORT) == set(ErrorCode)
    for code, transport in TRANSPORT.items():
        assert rows[code.value].split("|")[0].strip() == str(transport.status), code
        if transport.ws_close is not None:
            assert f"closed with {transport.ws_close}" in rows[code.value] or "closes with" in rows[code.value], code
