"""The in-memory session store: create / get / save, unknown ids, least-recently-used eviction of idle sessions."""

from __future__ import annotations

import pytest

from chat.protocol import (
    ErrorCode,
    InMemorySessionStore,
    ProtocolError,
    SamplingSettings,
    SessionState,
    SessionStore,
    Timings,
    TurnCreate,
    Usage,
)


def test_create_get_save():
    store = InMemorySessionStore()
    assert isinstance(store, SessionStore)
    session = store.create("m", "sys", SamplingSettings(seed=1))
    assert (session.model, session.system, session.sampling.seed) == ("m", "sys", 1)
    assert session.id.startswith("sess_") and len(session.id) == len("sess_") + 24
    assert store.get(session.id) is session and len(store) == 1


def test_get_unknown_is_unknown_session():
    with pytest.raises(ProtocolError) as info:
        InMemorySessionStore().get("sess_nope", "e")
    assert (info.value.code, info.value.event_id) == (ErrorCode.UNKNOWN_SESSION, "e")


def test_the_least_recently_used_idle_session_is_closed_when_full():
    store = InMemorySessionStore(max_sessions=2)
    a, b = store.create("m"), store.create("m")
    store.get(a.id)  # a is now more recent than b
    c = store.create("m")
    assert b.state is SessionState.CLOSED and b.id not in store
    assert a.id in store and c.id in store and len(store) == 2


def test_generating_sessions_are_not_evicted():
    store = InMemorySessionStore(max_sessions=1)
    a = store.create("m")
    plan = a.create_turn(TurnCreate(content="Hi"))
    with pytest.raises(ProtocolError) as info:
        store.create("m")
    assert info.value.code is ErrorCode.BUSY and a.id in store
    a.on_done(plan.turn_id, "Hello", "stop", Usage.of(1, 1), Timings())
    store.create("m")
    assert a.id not in store


def test_save_does_not_bring_back_a_closed_session():
    store = InMemorySessionStore(max_sessions=1)
    a = store.create("m")
    a.close()
    store.save(a)
    assert a.id not in store
    with pytest.raises(ProtocolError):
        store.get(a.id)


def test_max_sessions_must_be_positive():
    with pytest.raises(ValueError):
        InMemorySessionStore(max_sessions=0)


def test_a_session_is_found_by_its_owner_only_and_others_get_the_missing_answer():
    store = InMemorySessionStore()
    alice = store.create("m", owner="alice")
    assert alice.owner == "alice" and store.get(alice.id, owner="alice") is alice
    answers = []
    for session_id, owner in ((alice.id, "bob"), (alice.id, ""), ("sess_nope", "bob")):
        with pytest.raises(ProtocolError) as info:
            store.get(session_id, "e", owner=owner)
        answers.append((info.value.code, info.value.event_id, info.value.message.replace(session_id, "<id>")))
    assert answers[0] == answers[1] == answers[2] == (ErrorCode.UNKNOWN_SESSION, "e", "no session has id '<id>'")


def test_an_in_memory_store_calls_back_at_once_when_asked_about_writes():
    calls = []
    InMemorySessionStore().when_written("sess_x", lambda: calls.append(1))
    assert calls == [1]


def test_an_owner_at_its_quota_closes_its_own_oldest_idle_session_never_anothers():
    store = InMemorySessionStore(max_sessions=10, quota={"alice": 2}.get)
    bob = store.create("m", owner="bob")
    a1, a2 = store.create("m", owner="alice"), store.create("m", owner="alice")
    store.get(a1.id, owner="alice")  # a1 is now more recent than a2
    a3 = store.create("m", owner="alice")
    assert a2.state is SessionState.CLOSED and a2.id not in store
    assert all(s.id in store and s.state is SessionState.IDLE for s in (a1, a3, bob))
    for s in (a1, a3):  # both of hers generating: a third is refused, nothing closed
        s.create_turn(TurnCreate(content="hi"))
    with pytest.raises(ProtocolError) as info:
        store.create("m", owner="alice")
    assert info.value.code is ErrorCode.RATE_LIMITED and "open sessions is 2" in info.value.message
    assert a1.id in store and a3.id in store
    assert store.create("m", owner="bob").owner == "bob"  # bob has no quota
