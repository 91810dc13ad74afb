"""Sessions persist in SQLite: a restart keeps every conversation; a turn cut off by the restart is reported."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import connect

from chat.protocol.client_events import TurnCreate
from chat.protocol.server_events import Timings, Usage
from chat.protocol.session import SessionState
from chat.server.persistence.session_db import SqliteSessionStore
from tests.chat.server.conftest import make_server
from tests.chat.server.surfaces.test_ws import Client, ws_url


def test_a_session_comes_back_from_disk_with_its_conversation(tmp_path):
    db = tmp_path / "sessions.sqlite3"
    first = SqliteSessionStore(db)
    session = first.create("fake", system="be brief")
    plan = session.create_turn(TurnCreate(content="hello"))
    first.save(session)
    session.on_done(plan.turn_id, "hi there", "stop", Usage.of(5, 2), Timings())
    first.save(session)
    first.close()

    second = SqliteSessionStore(db)  # a new process
    again = second.get(session.id)
    assert again.system == "be brief" and again.state is SessionState.IDLE
    assert [(m.role, m.content) for m in again.messages] == [("user", "hello"), ("assistant", "hi there")]
    assert again.interrupted_turn_id is None
    again.check_invariants()


def test_a_turn_in_flight_at_a_crash_is_reported_as_interrupted_and_changes_nothing(tmp_path):
    db = tmp_path / "sessions.sqlite3"
    first = SqliteSessionStore(db)
    session = first.create("fake")
    plan = session.create_turn(TurnCreate(content="question"))
    first.save(session)
    first.flush()  # the server dies here, mid-reply, once the write is on disk

    second = SqliteSessionStore(db)
    again = second.get(session.id)
    assert again.state is SessionState.IDLE and again.messages == []
    assert again.info().interrupted_turn_id == plan.turn_id
    third = SqliteSessionStore(db)  # still reported after another restart, until a new turn starts
    resumed = third.get(session.id)
    assert resumed.interrupted_turn_id == plan.turn_id
    resumed.create_turn(TurnCreate(content="again"))
    assert resumed.interrupted_turn_id is None


def test_a_session_closed_for_room_is_read_back_from_disk(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.sqlite3", max_sessions=1)
    a = store.create("fake", system="first")
    store.create("fake", system="second")  # closes `a` in memory
    assert a.state is SessionState.CLOSED
    assert store.get(a.id).system == "first"


def test_the_server_keeps_conversations_across_a_restart(tmp_path):
    db = str(tmp_path / "sessions.sqlite3")

    async def first_life(url):
        async with connect(url) as ws:
            c = Client(ws)
            await c.send(type="session.create", system="persist me")
            created, _ = await c.until("session.created")
            await c.turn("remember this")
            return created["session"]["id"]

    async def second_life(url, session_id):
        async with connect(url) as ws:
            c = Client(ws)
            await c.send(type="session.resume", session_id=session_id)
            resumed, _ = await c.until("session.resumed")
            await c.send(type="conversation.get")
            conv, _ = await c.until("conversation")
            done = await c.turn("and now?")
            return resumed["session"], conv["messages"], done

    engine, srv = make_server(sessions_db=db)
    with srv:
        session_id = asyncio.run(first_life(ws_url(srv)))
    engine.close()
    engine, srv = make_server(sessions_db=db)
    with srv:
        info, messages, done = asyncio.run(second_life(ws_url(srv), session_id))
    engine.close()
    assert info["system"] == "persist me" and info["messages"] == 2 and "interrupted_turn_id" not in info
    assert messages[0]["content"] == "remember this"
    assert done["finish_reason"] == "stop"
