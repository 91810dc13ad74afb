"""Connection: frames in, steps out; session binding, stateless turns, cancel routing, engine results by turn id."""

from __future__ import annotations

import json

import pytest

from chat.protocol import (
    Connection,
    ErrorCode,
    ErrorEvent,
    InMemorySessionStore,
    ReplyDone,
    SessionState,
    Step,
    Timings,
    Usage,
    serialize_server_event,
)
from tests.chat.protocol.helpers import counter_ids, plan_json

USAGE = Usage.of(10, 2)
TIMINGS = Timings(ttft_ms=1.0, total_ms=2.0)


@pytest.fixture
def store() -> InMemorySessionStore:
    return InMemorySessionStore(new_id=counter_ids())


@pytest.fixture
def conn(store) -> Connection:
    return Connection(store, models=["m", "other"], new_id=counter_ids())


def send(conn: Connection, **event) -> Step:
    return conn.receive(json.dumps(event))


def wire(step: Step) -> list[dict]:
    return [json.loads(serialize_server_event(e)) for e in step.send]


def error_of(step: Step) -> ErrorEvent:
    [error] = step.send
    assert isinstance(error, ErrorEvent) and step.start is None and step.cancel == ()
    return error


def test_ping_pong(conn):
    assert wire(send(conn, type="ping", event_id="p")) == [{"type": "pong", "reply_to": "p"}]


def test_a_bad_frame_becomes_an_error_event(conn):
    error = error_of(conn.receive('{"type": "nope", "event_id": "z"}'))
    assert (error.code, error.reply_to) == (ErrorCode.UNKNOWN_EVENT, "z")
    assert error_of(conn.receive(b"\xff")).code is ErrorCode.INVALID_JSON


@pytest.mark.parametrize(
    "event",
    [
        {"type": "turn.create", "content": "Hi"},
        {"type": "turn.regenerate"},
        {"type": "turn.edit", "index": 0, "content": "x"},
        {"type": "session.update"},
        {"type": "conversation.get"},
    ],
)
def test_session_events_need_a_session(conn, event):
    error = error_of(send(conn, event_id="q", **event))
    assert (error.code, error.reply_to) == (ErrorCode.NO_SESSION, "q")


def test_a_whole_conversation_over_the_wire(conn, store):
    created = wire(send(conn, type="session.create", event_id="s", system="Be brief.", sampling={"seed": 3}))
    assert created[0]["type"] == "session.created" and created[0]["reply_to"] == "s"
    info = created[0]["session"]
    assert (info["model"], info["system"], info["sampling"]["seed"], info["state"]) == ("m", "Be brief.", 3, "idle")
    assert info["id"] in store

    step = send(conn, type="turn.create", event_id="t", content="Hi")
    plan = step.start
    assert plan is not None and wire(step)[0] == {
        "type": "turn.started",
        "reply_to": "t",
        "turn_id": plan.turn_id,
        "session_id": info["id"],
        "kind": "create",
        "user_message_id": plan.user_message_id,
    }
    assert plan.sampling.seed == 3
    assert conn.on_delta(plan.turn_id, "Hel").reply_to == "t"
    [done] = conn.on_done(plan.turn_id, "Hello", "stop", USAGE, TIMINGS)
    assert isinstance(done, ReplyDone) and done.message_id is not None

    [conversation] = wire(send(conn, type="conversation.get", event_id="c"))
    assert [(m["role"], m["content"]) for m in conversation["messages"]] == [("user", "Hi"), ("assistant", "Hello")]

    assert send(conn, type="turn.regenerate").start.kind == "regenerate"


def test_busy_and_cancel_through_the_connection(conn):
    send(conn, type="session.create")
    plan = send(conn, type="turn.create", content="Hi").start
    error = error_of(send(conn, type="turn.create", event_id="b", content="again"))
    assert (error.code, error.reply_to) == (ErrorCode.BUSY, "b")
    step = send(conn, type="turn.cancel", event_id="k")
    assert step == Step(cancel=(plan.turn_id,))  # no event now: the reply.done is the answer
    [done] = conn.on_done(plan.turn_id, "He", "cancelled", USAGE, TIMINGS)
    assert done.finish_reason == "cancelled"
    assert error_of(send(conn, type="turn.cancel", event_id="k2")).code is ErrorCode.NOT_GENERATING


def test_cancel_without_anything_running_is_not_generating(conn):
    assert error_of(send(conn, type="turn.cancel")).code is ErrorCode.NOT_GENERATING
    assert error_of(send(conn, type="turn.cancel", turn_id="turn_x")).code is ErrorCode.NOT_GENERATING


def test_unknown_model_and_session(conn):
    assert error_of(send(conn, type="session.create", model="gpt-9")).code is ErrorCode.UNKNOWN_MODEL
    assert send(conn, type="session.create", model="other").send[0].session.model == "other"
    error = error_of(send(conn, type="session.resume", event_id="r", session_id="sess_nope"))
    assert (error.code, error.reply_to) == (ErrorCode.UNKNOWN_SESSION, "r")


def test_resume_from_another_connection_shares_the_session(conn, store):
    session_id = send(conn, type="session.create").send[0].session.id
    plan = send(conn, type="turn.create", content="Hi").start
    other = Connection(store, models=["m"])
    resumed = wire(send(other, type="session.resume", event_id="r", session_id=session_id))[0]
    assert resumed["type"] == "session.resumed" and resumed["session"]["state"] == "generating"
    assert error_of(send(other, type="turn.create", content="x")).code is ErrorCode.BUSY  # one turn per session
    assert send(other, type="turn.cancel").cancel == (plan.turn_id,)
    conn.on_done(plan.turn_id, "Hello", "stop", USAGE, TIMINGS)
    assert [m["content"] for m in wire(send(other, type="conversation.get"))[0]["messages"]] == ["Hi", "Hello"]


def test_stateless_turns(conn):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    step = send(conn, type="completion.create", event_id="c", messages=messages, model="other", sampling={"seed": 1})
    plan = step.start
    assert plan_json(plan) == tuple(messages) and plan.model == "other" and plan.sampling.seed == 1
    assert wire(step)[0] == {"type": "turn.started", "reply_to": "c", "turn_id": plan.turn_id, "kind": "completion"}
    assert error_of(send(conn, type="completion.create", messages=messages)).code is ErrorCode.BUSY
    assert conn.on_delta(plan.turn_id, "A").reply_to == "c"
    [done] = conn.on_done(plan.turn_id, "A", "stop", USAGE, TIMINGS)
    assert (done.message_id, done.reply_to, done.text) == (None, "c", "A")
    assert send(conn, type="completion.create", messages=messages).start is not None  # free again


def test_cancel_a_stateless_turn_by_id_or_all(conn):
    messages = [{"role": "user", "content": "Q"}]
    plan = send(conn, type="completion.create", messages=messages).start
    assert send(conn, type="turn.cancel", turn_id=plan.turn_id).cancel == (plan.turn_id,)
    send(conn, type="session.create")
    session_plan = send(conn, type="turn.create", content="Hi").start
    assert send(conn, type="turn.cancel").cancel == (plan.turn_id, session_plan.turn_id)
    error, done = conn.on_error(plan.turn_id, ErrorCode.INVALID_MEDIA, "cannot decode image 0")
    assert (error.code, done.finish_reason) == (ErrorCode.INVALID_MEDIA, "error")
    error, done = conn.on_done(session_plan.turn_id, "", "error", USAGE, TIMINGS)
    assert (error.code, done.finish_reason) == (ErrorCode.INTERNAL, "error")
    assert conn.session.state is SessionState.IDLE and conn.session.messages == []


def test_a_turn_still_reports_to_its_session_after_switching(conn, store):
    first = send(conn, type="session.create").send[0].session.id
    plan = send(conn, type="turn.create", content="Hi").start
    send(conn, type="session.create")
    assert conn.session.id != first
    assert send(conn, type="turn.cancel", turn_id=plan.turn_id).cancel == (plan.turn_id,)
    assert error_of(send(conn, type="turn.cancel")).code is ErrorCode.NOT_GENERATING  # the new session is idle
    conn.on_done(plan.turn_id, "Hello", "stop", USAGE, TIMINGS)
    assert len(store.get(first).messages) == 2 and conn.session.messages == []


def test_close_returns_the_turns_to_cancel(conn):
    send(conn, type="session.create")
    plan = send(conn, type="turn.create", content="Hi").start
    stateless = send(conn, type="completion.create", messages=[{"role": "user", "content": "Q"}]).start
    assert set(conn.close()) == {plan.turn_id, stateless.turn_id}
    conn.on_done(plan.turn_id, "", "cancelled", USAGE, TIMINGS)
    conn.on_done(stateless.turn_id, "", "cancelled", USAGE, TIMINGS)
    assert conn.close() == () and conn.session.state is SessionState.IDLE


def test_engine_results_for_unknown_turns_are_a_caller_bug(conn):
    with pytest.raises(ValueError):
        conn.on_delta("turn_x", "a")
    with pytest.raises(ValueError):
        conn.on_error("turn_x", ErrorCode.INTERNAL, "x")


def test_a_connection_needs_a_model(store):
    with pytest.raises(ValueError):
        Connection(store, models=[])


def test_a_connection_resumes_only_its_own_tenants_sessions(store):
    alice = Connection(store, models=["m"], tenant="alice")
    created = wire(send(alice, type="session.create", system="alice's prompt"))[0]
    session_id = created["session"]["id"]
    assert store.get(session_id, owner="alice").owner == "alice"
    bob = Connection(store, models=["m"], tenant="bob")
    foreign = wire(send(bob, type="session.resume", session_id=session_id, event_id="r"))
    missing = wire(send(bob, type="session.resume", session_id="sess_nope", event_id="r"))
    assert json.dumps(foreign).replace(session_id, "<id>") == json.dumps(missing).replace("sess_nope", "<id>")
    assert foreign[0]["code"] == "unknown_session" and bob.session is None
    assert error_of(send(bob, type="conversation.get")).code is ErrorCode.NO_SESSION
    again = Connection(store, models=["m"], tenant="alice")
    assert wire(send(again, type="session.resume", session_id=session_id))[0]["session"]["system"] == "alice's prompt"


def test_a_tool_round_trip_through_the_connection(conn, store):
    from chat.protocol.tools import AssistantToolCall

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    send(conn, type="session.create")
    step = send(conn, type="turn.create", content="use f", tools=[tool], tool_choice="required", event_id="t")
    plan = step.start
    assert plan is not None and plan.tools[0].function.name == "f" and plan.tool_choice == "required"
    call = AssistantToolCall.model_validate({"id": "call_7", "function": {"name": "f", "arguments": "{}"}})
    assert json.loads(serialize_server_event(conn.on_tool_call(plan.turn_id, 0, call))) == {
        "type": "reply.tool_call",
        "reply_to": "t",
        "turn_id": plan.turn_id,
        "index": 0,
        "call": {"id": "call_7", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    }
    (done,) = conn.on_done(plan.turn_id, "", "tool_calls", USAGE, TIMINGS, [call])
    assert isinstance(done, ReplyDone) and done.tool_calls == [call] and done.message_id is not None
    error = error_of(send(conn, type="tool.results", results=[{"tool_call_id": "call_8", "content": "x"}]))
    assert error.code is ErrorCode.INVALID_EVENT and error.message.startswith("results.0.tool_call_id:")
    step = send(conn, type="tool.results", results=[{"tool_call_id": "call_7", "content": "42"}])
    assert step.start is not None and step.start.kind == "tool_results"
    assert wire(step)[0]["kind"] == "tool_results"
    conn.on_done(step.start.turn_id, "It is 42.", "stop", USAGE, TIMINGS)
    session = conn.session
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    assert store.get(session.id).messages == session.messages
    session.check_invariants()
