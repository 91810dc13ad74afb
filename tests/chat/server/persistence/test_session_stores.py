"""One session-store suite, run against both databases (SQLite and a real PostgreSQL server): the same semantics.

Each test opens stores through ``open_session_store`` with the backend's target (a file, or a ``postgresql://``
URL); a second store on the same target is a second process (a restart, or another ingress).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from websockets.asyncio.client import connect

from chat.protocol.client_events import TurnCreate, TurnEdit, TurnRegenerate
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.server_events import Timings, Usage
from chat.protocol.session import SessionState
from chat.server.persistence.pg_sessions import PostgresSessionStore
from chat.server.persistence.response_store import StoredResponse
from chat.server.persistence.session_backends import DurableSessionStore, open_session_store, response_store_for
from chat.server.persistence.session_db import SqliteSessionStore
from tests.chat.server.conftest import make_server
from tests.chat.server.persistence.conftest import one_turn, png
from tests.chat.server.surfaces.test_ws import Client, ws_url


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path) -> str:
    """Where the stores of one test keep their sessions."""
    if request.param == "sqlite":
        return str(tmp_path / "sessions.sqlite3")
    return request.getfixturevalue("postgres_url")


def reopen(store, target: str, **kwargs):
    """A new process on the same database, after ``store`` wrote what it had and closed."""
    store.close()
    return open_session_store(target, **kwargs)


def crash(store) -> None:
    """``store``'s process dies now: what it wrote stays, nothing else happens (no clean close)."""
    if isinstance(store, PostgresSessionStore):
        store.db.close()  # its connection goes, and its liveness lock with it
    else:
        store.flush()


def test_both_databases_implement_the_storage_interface(target):
    store = open_session_store(target)
    assert isinstance(store, DurableSessionStore) and isinstance(store, SqliteSessionStore | PostgresSessionStore)
    stats, pending = store.write_stats()
    assert (stats.transactions, stats.failures, pending) == (0, 0, 0)
    store.close()


def test_a_session_comes_back_with_its_conversation_settings_and_owner(target):
    first = open_session_store(target)
    session = first.create("fake", system="be brief", owner="alice")
    plan = session.create_turn(TurnCreate(content="hello", sampling={"temperature": 0.25}))
    first.save(session)
    session.on_done(plan.turn_id, "hi there", "stop", Usage.of(5, 2), Timings())
    first.save(session)
    second = reopen(first, target)
    again = second.get(session.id, owner="alice")
    assert again.system == "be brief" and again.state is SessionState.IDLE and again.interrupted_turn_id is None
    assert [(m.role, m.content) for m in again.messages] == [("user", "hello"), ("assistant", "hi there")]
    assert [m.id for m in again.messages] == [m.id for m in session.messages]
    again.check_invariants()
    second.close()


def test_a_turn_cut_off_with_its_process_is_reported_as_interrupted_and_changes_nothing(target):
    first = open_session_store(target)
    session = first.create("fake")
    one_turn(session, "kept", "yes")
    first.save(session)
    plan = session.create_turn(TurnCreate(content="question"))
    first.save(session)
    crash(first)  # mid-reply
    second = open_session_store(target)
    again = second.get(session.id)
    assert again.state is SessionState.IDLE and [m.content for m in again.messages] == ["kept", "yes"]
    assert again.info().interrupted_turn_id == plan.turn_id
    third = reopen(second, target)  # still reported after another restart, until a new turn starts
    resumed = third.get(session.id)
    assert resumed.interrupted_turn_id == plan.turn_id
    one_turn(resumed, "again", "fine")
    third.save(resumed)
    assert resumed.interrupted_turn_id is None
    assert [m.content for m in reopen(third, target).get(session.id).messages] == ["kept", "yes", "again", "fine"]


def test_a_session_closed_for_room_is_read_back(target):
    store = open_session_store(target, max_sessions=1)
    a = store.create("fake", system="first")
    store.create("fake", system="second")  # closes `a` in memory
    assert a.state is SessionState.CLOSED
    assert store.get(a.id).system == "first"
    store.close()


def test_a_session_of_another_owner_reads_exactly_as_a_missing_one(target):
    first = open_session_store(target)
    alice = first.create("fake", owner="alice")
    again = reopen(first, target)
    answers = []
    for sid in (alice.id, "sess_missing"):
        with pytest.raises(ProtocolError) as info:
            again.get(sid, "e", owner="bob")
        answers.append((info.value.code, info.value.event_id, info.value.message.replace(sid, "<id>")))
    assert answers[0] == answers[1] and answers[0][0] is ErrorCode.UNKNOWN_SESSION
    assert alice.id not in again  # nothing was loaded for bob
    assert again.get(alice.id, owner="alice").state is SessionState.IDLE
    again.close()


def test_branches_edits_media_and_tool_fields_read_back_as_they_were(target):
    store = open_session_store(target)
    session = store.create("fake")
    image = png(3)
    one_turn(session, [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": image}}], "a cat")
    store.save(session)
    one_turn(session, "second", "two")
    store.save(session)
    plan = session.regenerate(TurnRegenerate())  # a new branch of the last reply
    session.on_done(plan.turn_id, "two, again", "stop", Usage.of(5, 2), Timings())
    store.save(session)
    plan = session.edit(TurnEdit(message_id=session.messages[2].id, content="second, edited"))
    store.save(session)
    session.on_done(plan.turn_id, "edited reply", "length", Usage.of(5, 2), Timings())
    store.save(session)
    again = reopen(store, target).get(session.id)
    assert [m.model_dump() for m in again.messages] == [m.model_dump() for m in session.messages]
    assert again.messages[0].content[1].image_url.url == image
    assert [m.content for m in again.messages[2:]] == ["second, edited", "edited reply"]


def test_stored_responses_belong_to_their_tenant(target):
    store = open_session_store(target)
    responses = response_store_for(store)
    body = {"id": "resp_1", "object": "response", "output": []}
    responses.put("resp_1", StoredResponse("alice", ({"role": "user", "content": "hi"},), body))
    assert responses.get("resp_1", "bob") is None and responses.get("resp_missing", "alice") is None
    found = responses.get("resp_1", "alice")
    assert found.body == body and found.messages == ({"role": "user", "content": "hi"},)
    assert not responses.delete("resp_1", "bob") and responses.delete("resp_1", "alice")
    assert responses.get("resp_1", "alice") is None
    store.close()


def test_the_server_keeps_conversations_across_a_restart(target):
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
            done = await c.turn("and now?")
            return resumed["session"], done

    engine, srv = make_server(sessions_db=target)
    with srv:
        session_id = asyncio.run(first_life(ws_url(srv)))
        metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
    srv.app.state.sessions.close()
    engine.close()
    assert "\nturncache_session_write_failures_total 0\n" in metrics
    assert "\nturncache_session_rows_written_total 0\n" not in metrics  # the writes were counted
    engine, srv = make_server(sessions_db=target)
    with srv:
        info, done = asyncio.run(second_life(ws_url(srv), session_id))
    srv.app.state.sessions.close()
    engine.close()
    assert info["system"] == "persist me" and info["messages"] == 2 and "interrupted_turn_id" not in info
    assert done["finish_reason"] == "stop"
