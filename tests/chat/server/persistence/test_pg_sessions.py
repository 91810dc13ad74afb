"""What only a database that several processes share must do (a real PostgreSQL server): the version check that
resolves a session changed from two processes at once (the second change gets ``conflict``, nothing is lost), a
turn in progress on a live process versus one cut off with its process, one turn's writes atomic, versioned
migrations applied once."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from websockets.asyncio.client import connect

from chat.protocol.client_events import SessionUpdate, TurnCreate, TurnEdit
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.server_events import Timings, Usage
from chat.protocol.session import SessionState
from chat.server.persistence import pg_sessions
from chat.server.persistence.pg_sessions import PostgresSessionStore
from tests.chat.server.conftest import make_server
from tests.chat.server.persistence.conftest import one_turn
from tests.chat.server.surfaces.test_ws import Client, ws_url


def contents(session) -> list:
    return [m.content for m in session.messages]


def conflict(call) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call()
    assert info.value.code is ErrorCode.CONFLICT
    return info.value


def test_the_second_of_two_concurrent_turns_gets_conflict_and_nothing_is_lost(postgres_url):
    a, b = PostgresSessionStore(postgres_url), PostgresSessionStore(postgres_url)  # two ingresses
    session = a.create("fake", owner="t")
    one_turn(session, "first", "one")
    a.save(session)
    in_b = b.get(session.id, owner="t")
    plan_a = session.create_turn(TurnCreate(content="from a"))
    a.save(session)  # a's turn starts first
    plan_b = in_b.create_turn(TurnCreate(content="from b"))
    conflict(lambda: b.save(in_b))
    assert in_b.state is SessionState.IDLE and in_b.turn_id is None and contents(in_b) == ["first", "one"]
    with pytest.raises(ValueError):
        in_b.on_done(plan_b.turn_id, "never", "stop", Usage.of(1, 1), Timings())  # b's turn never started
    session.on_done(plan_a.turn_id, "a's reply", "stop", Usage.of(5, 2), Timings())
    a.save(session)
    again = b.get(session.id, owner="t")  # b's copy is read again: a's turn is there
    assert again is in_b and contents(again) == ["first", "one", "from a", "a's reply"]
    one_turn(again, "from b, again", "b's reply")
    b.save(again)
    fresh = PostgresSessionStore(postgres_url).get(session.id, owner="t")
    assert contents(fresh) == ["first", "one", "from a", "a's reply", "from b, again", "b's reply"]
    assert (a.conflicts, b.conflicts) == (0, 1)


def test_an_edit_from_a_stale_copy_gets_conflict_and_the_copy_is_read_again(postgres_url):
    a, b = PostgresSessionStore(postgres_url), PostgresSessionStore(postgres_url)
    session = a.create("fake")
    one_turn(session, "first", "one")
    a.save(session)
    stale = b.get(session.id)
    one_turn(session, "second", "two")  # a whole turn on a, b does not know
    a.save(session)
    stale.edit(TurnEdit(message_id=stale.messages[0].id, content="first, edited"))
    conflict(lambda: b.save(stale))
    assert contents(stale) == ["first", "one", "second", "two"]  # read again: a's turn kept, nothing cut
    stale.update(SessionUpdate(sampling={"temperature": 0.5}))  # a settings change from an up-to-date copy: fine
    b.save(stale)
    one_turn(session, "third", "three")  # now a is stale: its whole turn is refused, its copy read again
    conflict(lambda: a.save(session))
    assert session.sampling.temperature == 0.5 and contents(session) == ["first", "one", "second", "two"]
    assert contents(PostgresSessionStore(postgres_url).get(session.id)) == ["first", "one", "second", "two"]


def test_a_session_update_conflicts_while_another_process_runs_a_turn_and_is_read_again(postgres_url):
    a, b = PostgresSessionStore(postgres_url), PostgresSessionStore(postgres_url)
    session = a.create("fake", system="original")
    in_b = b.get(session.id)
    plan = session.create_turn(TurnCreate(content="long"))
    a.save(session)
    in_b.update(SessionUpdate(system="changed"))
    conflict(lambda: b.save(in_b))
    assert in_b.system == "original"
    session.on_done(plan.turn_id, "done", "stop", Usage.of(5, 2), Timings())
    a.save(session)
    assert contents(b.get(session.id)) == ["long", "done"]


def test_a_turn_running_on_a_live_process_is_not_interrupted_but_one_cut_off_with_it_is(postgres_url):
    a, b = PostgresSessionStore(postgres_url), PostgresSessionStore(postgres_url)
    session = a.create("fake")
    plan = session.create_turn(TurnCreate(content="running"))
    a.save(session)
    in_b = b.get(session.id)
    assert in_b.interrupted_turn_id is None and in_b.messages == []  # a still runs it: not cut off
    in_b.create_turn(TurnCreate(content="meanwhile"))
    conflict(lambda: b.save(in_b))
    a.db.close()  # a's process dies mid-turn: its liveness lock goes with its connection
    c = PostgresSessionStore(postgres_url)
    resumed = c.get(session.id)
    assert resumed.interrupted_turn_id == plan.turn_id and resumed.messages == []
    assert b.get(session.id).interrupted_turn_id == plan.turn_id  # b's live copy is read again too
    one_turn(in_b, "after the crash", "ok")
    b.save(in_b)
    assert contents(PostgresSessionStore(postgres_url).get(session.id)) == ["after the crash", "ok"]


def test_one_turn_is_written_in_one_transaction(postgres_url, monkeypatch):
    store = PostgresSessionStore(postgres_url)
    session = store.create("fake")
    one_turn(session, "kept", "yes")
    store.save(session)
    real = pg_sessions._insert_messages

    def fail_after_the_first(c, sid, start, messages):
        real(c, sid, start, messages[:1])
        raise psycopg.OperationalError("the server went away mid-write")

    monkeypatch.setattr(pg_sessions, "_insert_messages", fail_after_the_first)
    one_turn(session, "lost", "reply")
    store.save(session)  # logged and counted: the session stays in memory
    assert store.stats.failures == 1 and contents(session)[-1] == "reply"
    on_disk = PostgresSessionStore(postgres_url).get(session.id)
    assert contents(on_disk) == ["kept", "yes"]  # neither the user message nor the header's change landed
    monkeypatch.setattr(pg_sessions, "_insert_messages", real)
    one_turn(session, "then", "fine")
    store.save(session)  # rewritten whole, on the version check
    assert contents(PostgresSessionStore(postgres_url).get(session.id)) == [
        "kept",
        "yes",
        "lost",
        "reply",
        "then",
        "fine",
    ]


def test_two_servers_on_one_database_alternate_a_conversation_and_refuse_the_second_concurrent_turn(postgres_url):
    """Over the WebSocket, as two ingresses: a session created on one continues on the other; a socket whose copy is
    stale, or that sends a turn while the other server runs one, gets a ``conflict`` error event, and the
    conversation keeps every committed turn."""
    from tests.chat.engine.fakes import FakeRuntime

    engine1, one = make_server(sessions_db=postgres_url)
    engine2, two = make_server(sessions_db=postgres_url, runtime=FakeRuntime(delay_s=0.02))  # slow replies

    async def scenario():
        async with connect(ws_url(one)) as ws1, connect(ws_url(two)) as ws2:
            c1, c2 = Client(ws1), Client(ws2)
            await c1.send(type="session.create")
            created, _ = await c1.until("session.created")
            sid = created["session"]["id"]
            await c1.turn("on one")
            await c2.send(type="session.resume", session_id=sid)
            resumed, _ = await c2.until("session.resumed")
            await c2.turn("on two")
            await c1.send(type="turn.create", content="stale, on one", event_id="e1")  # c1's copy predates "on two"
            stale, _ = await c1.until("error")
            again = await c1.turn("stale, on one")  # read again by the conflict: now it runs
            await c2.send(type="session.resume", session_id=sid)
            await c2.until("session.resumed")
            await c2.send(type="turn.create", content="a long one " * 20)
            await c2.until("reply.delta")
            await c1.send(type="turn.create", content="at the same time", event_id="e2")
            busy, _ = await c1.until("error")
            done, _ = await c2.until("reply.done")
            await c1.send(type="session.resume", session_id=sid)  # a bound copy is read again on resume (or conflict)
            await c1.until("session.resumed")
            await c1.send(type="conversation.get")
            conv, _ = await c1.until("conversation")
            return resumed, stale, again, busy, done, conv

    with one, two:
        resumed, stale, again, busy, done, conv = asyncio.run(scenario())
    engine1.close()
    engine2.close()
    assert resumed["session"]["messages"] == 2
    assert (stale["code"], stale["reply_to"]) == ("conflict", "e1") and again["finish_reason"] == "stop"
    assert (busy["code"], busy["reply_to"]) == ("conflict", "e2") and done["finish_reason"] == "stop"
    users = [m["content"] for m in conv["messages"] if m["role"] == "user"]
    assert users == ["on one", "on two", "stale, on one", "a long one " * 20]
