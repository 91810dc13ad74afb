"""The session state machine: turns, busy, cancel, regenerate, edit, failures, limits. check_invariants after each."""

from __future__ import annotations

import pytest

from chat.protocol import (
    ConversationGet,
    ErrorCode,
    ErrorEvent,
    ProtocolError,
    ReplyDone,
    SamplingSettings,
    Session,
    SessionState,
    SessionUpdate,
    Timings,
    ToolResults,
    TurnCancel,
    TurnCreate,
    TurnEdit,
    TurnRegenerate,
    Usage,
)
from chat.protocol import limits as L
from chat.protocol.tools import AssistantToolCall
from tests.chat.protocol.helpers import IMAGE_PART, counter_ids, plan_json

USAGE = Usage.of(10, 2, cached_tokens=4)
TIMINGS = Timings(ttft_ms=5.0, decode_tokens_per_s=20.0, total_ms=60.0)


@pytest.fixture
def session() -> Session:
    return Session("m", system="Be brief.", new_id=counter_ids())


def turn(session: Session, text: str, reply: str, event_id: str | None = None) -> str:
    """One full turn; returns the turn id."""
    plan = session.create_turn(TurnCreate(content=text, event_id=event_id))
    session.check_invariants()
    session.on_done(plan.turn_id, reply, "stop", USAGE, TIMINGS)
    session.check_invariants()
    return plan.turn_id


def contents(session: Session) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in session.messages]


def refused(call, *args) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call(*args)
    return info.value


# ---------------------------------------------------------------- a normal turn


def test_a_turn_plans_the_rendered_conversation_and_commits_on_done(session):
    assert session.state is SessionState.IDLE
    plan = session.create_turn(TurnCreate(event_id="e1", content="Hi"))
    assert session.state is SessionState.GENERATING and session.turn_id == plan.turn_id
    assert plan_json(plan) == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert plan.kind == "create" and plan.model == "m" and plan.session_id == session.id and plan.reply_to == "e1"
    assert session.messages == []  # nothing is committed before the reply is done

    started = plan.started()
    assert (started.turn_id, started.reply_to, started.user_message_id) == (plan.turn_id, "e1", plan.user_message_id)
    delta = session.on_delta(plan.turn_id, "Hel", [1, 2])
    assert (delta.delta, delta.token_ids, delta.reply_to, delta.turn_id) == ("Hel", [1, 2], "e1", plan.turn_id)

    [done] = session.on_done(plan.turn_id, "Hello", "stop", USAGE, TIMINGS)
    assert isinstance(done, ReplyDone)
    assert (done.text, done.finish_reason, done.reply_to) == ("Hello", "stop", "e1")
    assert (done.usage, done.timings) == (USAGE, TIMINGS)
    assert session.state is SessionState.IDLE and session.turn_id is None
    assert contents(session) == [("user", "Hi"), ("assistant", "Hello")]
    assert session.messages[0].id == plan.user_message_id and session.messages[1].id == done.message_id
    assert session.messages[1].finish_reason == "stop"
    session.check_invariants()


def test_the_next_turn_renders_the_whole_history(session):
    turn(session, "one", "1")
    plan = session.create_turn(TurnCreate(content=[{"type": "text", "text": "two"}, IMAGE_PART]))
    assert [m["role"] for m in plan_json(plan)] == ["system", "user", "assistant", "user"]
    assert plan_json(plan)[-1]["content"] == [{"type": "text", "text": "two"}, IMAGE_PART]


def test_without_a_system_prompt_the_plan_starts_with_the_user():
    plan = Session("m").create_turn(TurnCreate(content="Hi"))
    assert plan_json(plan) == ({"role": "user", "content": "Hi"},)


def test_a_length_reply_is_kept(session):
    plan = session.create_turn(TurnCreate(content="Hi"))
    session.on_done(plan.turn_id, "Hel", "length", USAGE, TIMINGS)
    assert contents(session)[-1] == ("assistant", "Hel") and session.messages[-1].finish_reason == "length"


# ---------------------------------------------------------------- busy


def test_a_turn_while_generating_is_busy_and_changes_nothing(session):
    turn(session, "one", "1")
    plan = session.create_turn(TurnCreate(content="two"))
    before = list(session.messages)
    for call, event in (
        (session.create_turn, TurnCreate(event_id="b", content="three")),
        (session.regenerate, TurnRegenerate(event_id="b")),
        (session.edit, TurnEdit(event_id="b", index=0, content="x")),
    ):
        err = refused(call, event)
        assert err.code is ErrorCode.BUSY and err.event_id == "b" and plan.turn_id in err.message
    assert session.messages == before and session.turn_id == plan.turn_id
    session.check_invariants()


def test_update_and_conversation_are_allowed_while_generating(session):
    turn(session, "one", "1")
    plan = session.create_turn(TurnCreate(content="two"))
    conversation = session.conversation(ConversationGet(event_id="c"))
    assert conversation.generating == plan.turn_id and len(conversation.messages) == 2 and conversation.reply_to == "c"
    updated = session.update(SessionUpdate(sampling=SamplingSettings(temperature=1.5)))
    assert updated.session.sampling.temperature == 1.5
    assert plan.sampling.temperature is None  # the running turn keeps its settings (the model default)


# ---------------------------------------------------------------- cancel


def test_cancel_when_idle_is_not_generating(session):
    err = refused(session.cancel, TurnCancel(event_id="x"))
    assert err.code is ErrorCode.NOT_GENERATING and err.event_id == "x"


def test_cancel_names_the_turn_to_stop_and_waits_for_on_done(session):
    plan = session.create_turn(TurnCreate(content="Hi"))
    assert session.cancel(TurnCancel()) == plan.turn_id
    assert session.cancel(TurnCancel(turn_id=plan.turn_id)) == plan.turn_id  # twice is harmless
    assert session.state is SessionState.GENERATING  # until the engine reports
    err = refused(session.cancel, TurnCancel(turn_id="turn_other"))
    assert err.code is ErrorCode.NOT_GENERATING and "turn_other" in err.message


def test_a_cancelled_reply_with_text_is_kept_as_partial(session):
    plan = session.create_turn(TurnCreate(content="Hi"))
    session.cancel(TurnCancel())
    [done] = session.on_done(plan.turn_id, "Hel", "cancelled", USAGE, TIMINGS)
    assert done.finish_reason == "cancelled" and done.message_id == session.messages[-1].id
    assert contents(session) == [("user", "Hi"), ("assistant", "Hel")]
    assert session.messages[-1].finish_reason == "cancelled"
    session.check_invariants()


def test_a_cancelled_reply_without_text_leaves_the_conversation_unchanged(session):
    turn(session, "one", "1")
    before = list(session.messages)
    plan = session.create_turn(TurnCreate(content="two"))
    [done] = session.on_done(plan.turn_id, " \n", "cancelled", USAGE, TIMINGS)
    assert done.message_id is None and session.messages == before and session.state is SessionState.IDLE
    session.check_invariants()


# ---------------------------------------------------------------- regenerate


def test_regenerate_answers_the_same_prompt_and_replaces_the_reply(session):
    turn(session, "one", "1")
    turn(session, "two", "2")
    user_id = session.messages[2].id
    plan = session.regenerate(TurnRegenerate(event_id="r"))
    assert plan.kind == "regenerate" and plan.user_message_id == user_id
    assert [m["content"] for m in plan_json(plan)] == ["Be brief.", "one", "1", "two"]
    assert contents(session)[-1] == ("assistant", "2")  # the old reply stays until the new one is done
    [done] = session.on_done(plan.turn_id, "2 again", "stop", USAGE, TIMINGS)
    assert contents(session) == [("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2 again")]
    assert session.messages[2].id == user_id and session.messages[3].id == done.message_id
    session.check_invariants()


def test_a_cancelled_regenerate_without_text_keeps_the_old_reply(session):
    turn(session, "one", "1")
    plan = session.regenerate(TurnRegenerate())
    session.on_done(plan.turn_id, "", "cancelled", USAGE, TIMINGS)
    assert contents(session) == [("user", "one"), ("assistant", "1")]


def test_regenerate_with_nothing_to_regenerate_is_invalid(session):
    err = refused(session.regenerate, TurnRegenerate(event_id="r"))
    assert err.code is ErrorCode.INVALID_EVENT and err.event_id == "r" and session.state is SessionState.IDLE


# ---------------------------------------------------------------- edit


@pytest.mark.parametrize("by", ["index", "message_id"])
def test_edit_replaces_the_user_message_and_drops_what_follows(session, by):
    turn(session, "one", "1")
    turn(session, "two", "2")
    turn(session, "three", "3")
    old_id = session.messages[2].id
    target = {"index": 2} if by == "index" else {"message_id": old_id}
    plan = session.edit(TurnEdit(content="TWO", **target))
    assert plan.kind == "edit" and plan.user_message_id != old_id  # a new branch, a new id
    assert [m["content"] for m in plan_json(plan)] == ["Be brief.", "one", "1", "TWO"]
    assert len(session.messages) == 6  # unchanged until done
    session.on_done(plan.turn_id, "2'", "stop", USAGE, TIMINGS)
    assert contents(session) == [("user", "one"), ("assistant", "1"), ("user", "TWO"), ("assistant", "2'")]
    assert session.messages[2].id == plan.user_message_id
    session.check_invariants()


def test_edit_of_the_first_message_starts_over(session):
    turn(session, "one", "1")
    plan = session.edit(TurnEdit(index=0, content="uno"))
    assert plan_json(plan) == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "uno"})


EDIT_ERRORS = {
    "index out of range": ({"index": 4}, "index: 4 is out of range"),
    "index far out of range": ({"index": 10**6}, "out of range"),
    "an assistant message by index": ({"index": 1}, "only user messages can be edited"),
    "an assistant message by id": ({"message_id": "msg_4"}, "only user messages can be edited"),
    "an unknown id": ({"message_id": "msg_404"}, "no message has id 'msg_404'"),
}


@pytest.mark.parametrize(("target", "message"), EDIT_ERRORS.values(), ids=EDIT_ERRORS.keys())
def test_edit_refusals(session, target, message):
    turn(session, "one", "1")  # msg_2 (user), turn_3, msg_4 (assistant)
    turn(session, "two", "2")
    before = list(session.messages)
    err = refused(session.edit, TurnEdit(event_id="x", content="new", **target))
    assert err.code is ErrorCode.INVALID_EVENT and message in err.message and err.event_id == "x"
    assert session.messages == before and session.state is SessionState.IDLE


def test_edit_on_an_empty_conversation_is_out_of_range(session):
    assert refused(session.edit, TurnEdit(index=0, content="x")).code is ErrorCode.INVALID_EVENT


# ---------------------------------------------------------------- failures


def test_on_error_reports_and_leaves_the_conversation_unchanged(session):
    turn(session, "one", "1")
    before = list(session.messages)
    plan = session.create_turn(TurnCreate(event_id="e", content="two"))
    error, done = session.on_error(plan.turn_id, ErrorCode.CONTEXT_OVERFLOW, "the prompt has 9000 tokens")
    assert isinstance(error, ErrorEvent) and isinstance(done, ReplyDone)
    assert (error.code, error.turn_id, error.reply_to) == (ErrorCode.CONTEXT_OVERFLOW, plan.turn_id, "e")
    assert (done.finish_reason, done.message_id, done.usage.total_tokens) == ("error", None, 0)
    assert session.messages == before and session.state is SessionState.IDLE
    session.check_invariants()
    turn(session, "two again", "2")  # the session is usable afterwards


def test_on_done_with_error_is_an_internal_error(session):
    plan = session.create_turn(TurnCreate(content="Hi"))
    error, done = session.on_done(plan.turn_id, "partial", "error", USAGE, TIMINGS)
    assert error.code is ErrorCode.INTERNAL and done.finish_reason == "error" and done.usage == USAGE
    assert session.messages == []


def test_engine_results_for_another_turn_are_a_caller_bug(session):
    with pytest.raises(ValueError):
        session.on_delta("turn_nope", "x")
    plan = session.create_turn(TurnCreate(content="Hi"))
    with pytest.raises(ValueError):
        session.on_done("turn_nope", "x", "stop", USAGE, TIMINGS)
    session.on_done(plan.turn_id, "x", "stop", USAGE, TIMINGS)
    with pytest.raises(ValueError):
        session.on_done(plan.turn_id, "x", "stop", USAGE, TIMINGS)  # a turn ends once


# ---------------------------------------------------------------- settings, close, limits


def test_update_changes_only_what_was_sent(session):
    session.update(SessionUpdate(sampling=SamplingSettings(temperature=0.5, stop=["x"])))
    session.update(SessionUpdate.model_validate({"sampling": {"top_k": 3}}))
    assert session.sampling == SamplingSettings(temperature=0.5, top_k=3, stop=["x"])
    assert session.system == "Be brief."
    session.update(SessionUpdate.model_validate({"system": None}))
    assert session.system is None
    plan = session.create_turn(TurnCreate(content="Hi"))
    assert plan_json(plan)[0]["role"] == "user" and plan.sampling.top_k == 3


def test_a_closed_session_refuses_client_events_but_finishes_its_turn(session):
    plan = session.create_turn(TurnCreate(content="Hi"))
    assert session.close() == plan.turn_id
    assert session.state is SessionState.CLOSED
    for call, event in (
        (session.create_turn, TurnCreate(content="x")),
        (session.regenerate, TurnRegenerate()),
        (session.edit, TurnEdit(index=0, content="x")),
        (session.update, SessionUpdate()),
        (session.conversation, ConversationGet()),
    ):
        assert refused(call, event).code is ErrorCode.UNKNOWN_SESSION
    assert session.cancel(TurnCancel()) == plan.turn_id  # the running turn can still be stopped
    session.on_done(plan.turn_id, "Hello", "cancelled", USAGE, TIMINGS)
    assert session.state is SessionState.CLOSED and session.turn_id is None
    session.check_invariants()


def test_the_conversation_length_is_limited(session):
    limit_turns = (L.MAX_MESSAGES - 1) // 2  # system + user/assistant pairs
    for i in range(limit_turns):
        turn(session, f"q{i}", f"a{i}")
    assert len(session.messages) + 1 + 2 > L.MAX_MESSAGES
    err = refused(session.create_turn, TurnCreate(event_id="o", content="one more"))
    assert err.code is ErrorCode.CONTEXT_OVERFLOW and err.event_id == "o" and session.state is SessionState.IDLE
    plan = session.regenerate(TurnRegenerate())  # the same length is still fine
    session.on_done(plan.turn_id, "again", "stop", USAGE, TIMINGS)


def test_the_media_in_a_conversation_is_limited(session):
    per_turn = L.MAX_MEDIA_PER_TURN
    for _ in range(L.MAX_MEDIA_PER_CONVERSATION // per_turn):
        plan = session.create_turn(TurnCreate(content=[IMAGE_PART] * per_turn))
        session.on_done(plan.turn_id, "ok", "stop", USAGE, TIMINGS)
    err = refused(session.create_turn, TurnCreate(content=[IMAGE_PART]))
    assert err.code is ErrorCode.CONTEXT_OVERFLOW and "media" in err.message
    plan = session.edit(TurnEdit(index=0, content="no picture"))  # editing drops media: allowed again
    assert sum(isinstance(m["content"], list) for m in plan_json(plan)) == 0


def test_info_reports_the_settings_and_state(session):
    turn(session, "one", "1")
    info = session.info()
    assert (info.id, info.model, info.system, info.messages, info.state) == (session.id, "m", "Be brief.", 2, "idle")


def test_a_reply_longer_than_a_client_message_is_stored(session):
    plan = session.create_turn(TurnCreate(content="Write a lot."))
    long_reply = "x" * (L.MAX_TEXT_CHARS + 1)
    [done] = session.on_done(plan.turn_id, long_reply, "length", USAGE, TIMINGS)
    assert session.messages[-1].content == long_reply and done.text == long_reply
    assert session.conversation().messages[-1].content == long_reply


# ---------------------------------------------------------------- tool calls and their results

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _call(call_id: str) -> AssistantToolCall:
    return AssistantToolCall.model_validate(
        {"id": call_id, "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    )


def _called(session: Session, *call_ids: str) -> None:
    plan = session.create_turn(TurnCreate.model_validate({"content": "Weather?", "tools": [TOOL]}))
    assert plan.tools[0].function.name == "get_weather" and plan.tool_choice is None
    (done,) = session.on_done(plan.turn_id, "", "tool_calls", USAGE, TIMINGS, [_call(c) for c in call_ids])
    assert done.finish_reason == "tool_calls" and [c.id for c in done.tool_calls] == list(call_ids)
    session.check_invariants()


def _results(*pairs: tuple[str, str], event_id: str | None = None) -> ToolResults:
    results = [{"tool_call_id": c, "content": text} for c, text in pairs]
    return ToolResults.model_validate({"results": results, "event_id": event_id, "tools": [TOOL]})


def test_tool_results_follow_a_reply_with_calls_and_join_the_conversation_with_the_next_reply(session):
    _called(session, "call_a", "call_b")
    plan = session.tool_results(_results(("call_a", "sunny"), ("call_b", "windy")))
    assert plan.kind == "tool_results" and plan.tools and len(session.messages) == 2  # nothing committed yet
    assert [(m.role, m.tool_call_id) for m in plan.messages[-2:]] == [("tool", "call_a"), ("tool", "call_b")]
    assert [c.id for c in plan.messages[2].tool_calls] == ["call_a", "call_b"]
    session.check_invariants()
    session.on_done(plan.turn_id, "Sunny and windy.", "stop", USAGE, TIMINGS)
    session.check_invariants()
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "tool", "assistant"]


def test_a_failed_turn_after_tool_results_leaves_them_out(session):
    _called(session, "call_a")
    plan = session.tool_results(_results(("call_a", "sunny")))
    session.on_error(plan.turn_id, ErrorCode.INTERNAL, "boom")
    assert [m.role for m in session.messages] == ["user", "assistant"]
    session.tool_results(_results(("call_a", "sunny")))  # may be sent again
    session.check_invariants()


@pytest.mark.parametrize(
    ("pairs", "field"),
    [
        ((("call_x", "?"),), "results.0.tool_call_id"),
        ((("call_a", "1"), ("call_a", "2")), "results.1.tool_call_id"),
    ],
)
def test_a_result_that_answers_no_call_is_refused_by_name(session, pairs, field):
    _called(session, "call_a")
    exc = refused(session.tool_results, _results(*pairs, event_id="r1"))
    assert exc.code is ErrorCode.INVALID_EVENT and exc.message.startswith(f"{field}:") and exc.event_id == "r1"
    assert session.state is SessionState.IDLE and len(session.messages) == 2
    turn(session, "still usable", "yes")


def test_tool_results_without_a_preceding_call_are_refused(session):
    exc = refused(session.tool_results, _results(("call_a", "sunny")))
    assert exc.code is ErrorCode.INVALID_EVENT and exc.message.startswith("results.0.tool_call_id:")
    turn(session, "Hi", "Hello")
    exc = refused(session.tool_results, _results(("call_a", "sunny")))
    assert "not a reply with tool calls" in exc.message
