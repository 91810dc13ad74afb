"""Property tests: the parser only ever raises ProtocolError; a connection survives any sequence of frames and
engine results with its sessions' invariants intact, and every started turn ends with exactly one reply.done."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.protocol import (
    CLIENT_EVENT_TYPES,
    Connection,
    ErrorCode,
    InMemorySessionStore,
    ProtocolError,
    ReplyDone,
    Timings,
    TurnStarted,
    Usage,
    client_events,
    content,
    parse_client_event,
    sampling,
)
from chat.protocol.base import WireModel
from tests.chat.protocol.helpers import AUDIO_PART, CLIENT_EXAMPLES, IMAGE_PART, TEXT_PART, VIDEO_PART, counter_ids

# every field name of every client-side wire model: random objects use them so that validators get reached
FIELDS = sorted(
    {
        name
        for module in (client_events, content, sampling)
        for model in vars(module).values()
        if isinstance(model, type) and issubclass(model, WireModel)
        for name in model.model_fields
    }
)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.sampled_from(FIELDS)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=30,
)
parts = st.sampled_from([TEXT_PART, IMAGE_PART, AUDIO_PART, VIDEO_PART]) | json_values
event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(CLIENT_EVENT_TYPES)},
    optional={
        "event_id": json_values,
        "content": st.text(max_size=10) | st.lists(parts, max_size=4) | json_values,
        "sampling": st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
                    "content": st.text(max_size=5) | st.lists(parts, max_size=2),
                }
            ),
            max_size=4,
        ),
        "index": json_values,
        "message_id": json_values,
        "session_id": json_values,
        "turn_id": json_values,
        "model": json_values,
        "system": json_values,
    },
)


def only_protocol_errors(raw: str | bytes) -> None:
    try:
        parse_client_event(raw)
    except ProtocolError as exc:
        assert exc.message and (exc.event_id is None or isinstance(exc.event_id, str))


# pieces of JSON, escapes, lone surrogates, a NUL: joined at random they make near-JSON text
TOKENS = ["{", "}", "[", "]", '"', ":", ",", " ", "\\", "\\u", "\ud800", "\udfff", "é", "\x00", "NaN", "1e999"]
TOKENS += ["null", '"type"', '"ping"', '"event_id"', '"turn.create"', '"content"']
jsonish_text = st.lists(st.sampled_from(TOKENS) | st.characters(exclude_categories=()), max_size=60).map("".join)


@given(st.text() | jsonish_text)
def test_any_text(raw):
    only_protocol_errors(raw)


@given(st.binary())
def test_any_bytes(raw):
    only_protocol_errors(raw)


@given(json_values)
def test_any_json(value):
    only_protocol_errors(json.dumps(value, allow_nan=True))


@given(event_like)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_anything_shaped_like_an_event(value):
    only_protocol_errors(json.dumps(value, allow_nan=True))


@given(st.sampled_from(CLIENT_EXAMPLES), st.data())
def test_valid_events_with_one_value_replaced(example, data):
    obj = json.loads(example.model_dump_json(exclude_none=True))
    node = obj
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        if isinstance(node[key], dict | list) and node[key] and data.draw(st.booleans()):
            node = node[key]
            continue
        node[key] = data.draw(json_values)
        break
    only_protocol_errors(json.dumps(obj, allow_nan=True))


@given(st.integers(min_value=1, max_value=5000), st.sampled_from(["[", '{"a":', '[{"b":']))
def test_deep_nesting(depth, opener):
    only_protocol_errors(opener * depth)
    only_protocol_errors('{"type":"ping","event_id":' + opener * depth)


# ---------------------------------------------------------------- a connection under random traffic

FRAMES = [
    {"type": "session.create", "system": "S"},
    {"type": "session.resume", "session_id": "sess_1"},
    {"type": "turn.create", "content": "hi"},
    {"type": "turn.create", "content": [TEXT_PART, IMAGE_PART]},
    {"type": "turn.regenerate"},
    {"type": "turn.edit", "index": 0, "content": "edited"},
    {"type": "turn.edit", "index": 2, "content": "edited"},
    {"type": "turn.cancel"},
    {"type": "session.update", "sampling": {"temperature": 1}},
    {"type": "conversation.get"},
    {"type": "completion.create", "messages": [{"role": "user", "content": "q"}]},
    {"type": "ping"},
]
actions = st.lists(
    st.one_of(
        st.tuples(st.just("frame"), st.sampled_from(FRAMES)),
        st.tuples(st.just("delta"), st.integers(0, 3)),
        st.tuples(
            st.just("done"),
            st.integers(0, 3),
            st.sampled_from(["stop", "length", "cancelled", "error"]),
            st.sampled_from(["", "answer"]),
        ),
        st.tuples(st.just("fail"), st.integers(0, 3)),
    ),
    max_size=40,
)


@given(actions)
@settings(max_examples=200)
def test_a_connection_survives_any_traffic(script):
    store = InMemorySessionStore(new_id=counter_ids())
    conn = Connection(store, models=["m"], new_id=counter_ids())
    running: list[str] = []  # turn ids started and not yet done
    for action in script:
        if action[0] == "frame":
            step = conn.receive(json.dumps(action[1]))
            started = [e.turn_id for e in step.send if isinstance(e, TurnStarted)]
            assert started == ([step.start.turn_id] if step.start else [])
            running += started
        elif running:
            turn_id = running[action[1] % len(running)]
            if action[0] == "delta":
                assert conn.on_delta(turn_id, "x").turn_id == turn_id
                continue
            if action[0] == "done":
                events = conn.on_done(turn_id, action[3], action[2], Usage.of(3, 1), Timings())
            else:
                events = conn.on_error(turn_id, ErrorCode.INTERNAL, "boom")
            assert isinstance(events[-1], ReplyDone) and events[-1].turn_id == turn_id
            assert all(not isinstance(e, ReplyDone) for e in events[:-1])
            running.remove(turn_id)
        if conn.session is not None:
            conn.session.check_invariants()
    assert set(conn.close()) == set(running)
