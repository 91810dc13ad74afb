"""The sessions database, one row per message: a turn's write is O(new messages), media are stored once, a file of
the previous format is migrated on open, two processes can share the file, and a failed write leaves the server
serving from memory."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from chat.protocol.client_events import TurnCreate
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.server_events import Timings, Usage
from chat.protocol.session import Session, SessionState
from chat.server.persistence.session_db import SqliteSessionStore
from chat.server.persistence.session_rows import FORMAT, SessionDbError
from tests.chat.server.conftest import make_server
from tests.chat.server.persistence.conftest import one_turn, png, rows
from tests.chat.server.surfaces.test_ws import Client, ws_url

V1_FILE = Path(__file__).parents[1] / "data" / "sessions_v1.sqlite3"


def test_a_database_of_the_previous_format_is_migrated_on_open(tmp_path):
    path = tmp_path / "sessions.sqlite3"
    shutil.copy(V1_FILE, path)
    store = SqliteSessionStore(path)
    other = SqliteSessionStore(path)  # a second process opening the file: it is migrated once
    first = store.get("sess_1", owner="default")
    assert (first.system, first.sampling.temperature, first.sampling.seed) == ("be brief", 0.5, 3)
    assert [m.role for m in first.messages] == ["user", "assistant"] * 2
    assert first.messages[1].content == "a red square" and first.messages[0].content[1].type == "image_url"
    assert first.messages[0].content[1] == first.messages[2].content[0]  # the same image, stored once below
    interrupted = other.get("sess_8", owner="default")
    assert interrupted.interrupted_turn_id == "turn_10" and interrupted.messages == [] and interrupted.system == "terse"
    assert other.get("sess_11", owner="default").messages == []
    for owner in ("", "alice"):  # migrated sessions belong to the tenant "default" only
        with pytest.raises(ProtocolError) as info:
            store.get("sess_11", owner=owner)
        assert info.value.code is ErrorCode.UNKNOWN_SESSION
    one_turn(first, "a third question", "a third answer")
    store.save(first)
    store.close()
    other.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "sessions_v1" not in tables and rows(path, "media") == 1
    assert len(SqliteSessionStore(path).get("sess_1", owner="default").messages) == 6


def test_an_unreadable_old_row_is_kept_aside_not_lost(tmp_path):
    path = tmp_path / "sessions.sqlite3"
    shutil.copy(V1_FILE, path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE sessions SET messages = '[{\"broken\": ' WHERE id = 'sess_11'")
    store = SqliteSessionStore(path)
    assert len(store.get("sess_1", owner="default").messages) == 4
    with pytest.raises(ProtocolError):
        store.get("sess_11", owner="default")
    store.close()
    assert rows(path, "sessions_v1_unmigrated") == 1


def test_a_file_of_another_format_or_unwritable_is_refused_naming_it(tmp_path):
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {FORMAT + 1}")
    with pytest.raises(SessionDbError, match=str(newer)):
        SqliteSessionStore(newer)
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE sessions (something TEXT)")
    with pytest.raises(SessionDbError, match="unknown format"):
        SqliteSessionStore(foreign)
    not_a_db = tmp_path / "not.sqlite3"
    not_a_db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(SessionDbError, match=str(not_a_db)):
        SqliteSessionStore(not_a_db)


def test_two_processes_sharing_the_file_keep_every_session_whole(tmp_path):
    path = tmp_path / "shared.sqlite3"
    counter = itertools.count()
    ids = lambda prefix: f"{prefix}_{next(counter):06d}"  # noqa: E731 - unique across both stores
    a, b = SqliteSessionStore(path, new_id=ids), SqliteSessionStore(path, new_id=ids)
    shared = a.create("fake", owner="t")
    one_turn(shared, "first", "one")
    a.save(shared)
    a.flush()
    own_b = b.create("fake", owner="t")
    one_turn(own_b, "b's own", "b")
    b.save(own_b)
    in_b = b.get(shared.id, owner="t")  # read from disk by the other process
    one_turn(in_b, "second, from b", "two-b")
    b.save(in_b)
    b.flush()
    one_turn(shared, "second, from a", "two-a")  # a's copy is stale: its write finds b's version and rewrites whole
    a.save(shared)
    a.close()
    b.close()
    third = SqliteSessionStore(path)
    assert [m.content for m in third.get(shared.id, owner="t").messages] == ["first", "one", "second, from a", "two-a"]
    assert [m.content for m in third.get(own_b.id, owner="t").messages] == ["b's own", "b"]


def test_a_session_of_another_owner_reads_as_missing(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    alice = store.create("fake", owner="alice")
    store.close()
    again = SqliteSessionStore(tmp_path / "s.sqlite3")
    answers = []
    for sid in (alice.id, "sess_missing"):
        with pytest.raises(ProtocolError) as info:
            again.get(sid, "e", owner="bob")
        answers.append((info.value.code, info.value.event_id, info.value.message.replace(sid, "<id>")))
    assert answers[0] == answers[1]
    assert alice.id not in again  # nothing was loaded for bob
    assert again.get(alice.id, owner="alice").state is SessionState.IDLE


def test_rows_that_do_not_fit_together_are_an_internal_error_for_that_session_only(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    broken, fine = store.create("fake"), store.create("fake")
    for s in (broken, fine):
        one_turn(
            s, [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": png(s is fine)}}], "ok"
        )
        store.save(s)
    store.close()
    with sqlite3.connect(store.path) as db:
        db.execute(
            "DELETE FROM media WHERE hash IN (SELECT hash FROM message_media WHERE session_id = ?)", (broken.id,)
        )
    again = SqliteSessionStore(store.path)
    with pytest.raises(ProtocolError) as info:
        again.get(broken.id)
    assert info.value.code is ErrorCode.INTERNAL
    assert len(again.get(fine.id).messages) == 2


def test_a_reply_is_acknowledged_once_it_is_on_disk(tmp_path, monkeypatch):
    """reply.done (and session.created) go out after their write: a crash right after them loses nothing."""
    import chat.server.persistence.session_writer as writer_module

    slow = writer_module.insert_messages

    def slow_insert(*args, **kwargs):
        time.sleep(0.3)  # a slow disk
        return slow(*args, **kwargs)

    monkeypatch.setattr(writer_module, "insert_messages", slow_insert)
    path = tmp_path / "sessions.sqlite3"
    engine, srv = make_server(sessions_db=str(path))

    def on_disk(session_id: str) -> tuple[int, int]:
        with sqlite3.connect(path) as db:
            sessions = db.execute("SELECT COUNT(*) FROM sessions WHERE id = ?", (session_id,)).fetchone()[0]
            messages = db.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0]
        return sessions, messages

    with srv:

        async def scenario() -> list[tuple[int, int]]:
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.send(type="session.create")
                created, _ = await c.until("session.created")
                session_id = created["session"]["id"]
                seen = [on_disk(session_id)]
                await c.turn("keep me")
                seen.append(on_disk(session_id))
                return seen

        assert asyncio.run(scenario()) == [(1, 0), (1, 2)]
    engine.close()


def _tool_round(session: Session) -> None:
    from chat.protocol.client_events import ToolResults
    from chat.protocol.tools import AssistantToolCall

    plan = session.create_turn(TurnCreate(content="weather?"))
    call = AssistantToolCall.model_validate({"id": "call_1", "function": {"name": "f", "arguments": '{"a":1}'}})
    session.on_done(plan.turn_id, "", "tool_calls", Usage.of(5, 2), Timings(), [call])
    results = ToolResults.model_validate({"results": [{"tool_call_id": "call_1", "content": "sunny"}]})
    plan = session.tool_results(results)
    session.on_done(plan.turn_id, "It is sunny.", "stop", Usage.of(9, 2), Timings())


def test_tool_calls_and_results_are_kept_and_a_format_2_file_gets_their_column(tmp_path):
    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionStore(path)
    plain = store.create("fake", owner="t")
    one_turn(plain, "hello", "hi")
    store.save(plain)
    store.close()
    with sqlite3.connect(path) as db:  # as format 2 wrote it: no tools column
        db.execute("ALTER TABLE messages DROP COLUMN tools")
        db.execute("PRAGMA user_version = 2")
    store = SqliteSessionStore(path)
    assert [m.content for m in store.get(plain.id, owner="t").messages] == ["hello", "hi"]
    session = store.create("fake", owner="t")
    _tool_round(session)
    store.save(session)
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == FORMAT == 3
    back = SqliteSessionStore(path).get(session.id, owner="t")
    assert back.messages == session.messages
    assert back.messages[1].tool_calls[0].id == "call_1" and back.messages[2].tool_call_id == "call_1"
    back.check_invariants()
