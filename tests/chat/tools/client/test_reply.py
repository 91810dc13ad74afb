"""chat/tools/client/reply.py: a finished turn's ``Reply`` as read from its ``reply.done``."""

from chat.protocol.server_events import ReplyDone, Timings, Usage
from chat.protocol.tools import AssistantToolCall, CallFunction
from chat.tools.client.reply import Reply


def _done(**fields) -> ReplyDone:
    base = {
        "turn_id": "turn_1",
        "message_id": "msg_2",
        "text": "Hello there",
        "finish_reason": "stop",
        "usage": Usage.of(prompt_tokens=40, completion_tokens=3, cached_tokens=32),
        "timings": Timings(ttft_ms=12.5, decode_tokens_per_s=80.0, total_ms=40.0, prefill_ms=3.0),
    }
    return ReplyDone(**(base | fields))


def test_a_reply_carries_the_done_events_text_ids_counts_and_timings():
    reply = Reply.of(_done())
    assert (reply.text, reply.finish_reason, reply.turn_id, reply.message_id) == (
        "Hello there",
        "stop",
        "turn_1",
        "msg_2",
    )
    assert (reply.prompt_tokens, reply.cached_tokens, reply.completion_tokens) == (40, 32, 3)
    assert (reply.ttft_ms, reply.decode_tokens_per_s) == (12.5, 80.0)
    assert reply.tool_calls == ()


def test_a_replys_tool_calls_are_kept_in_order_as_a_tuple():
    calls = [
        AssistantToolCall(id="call_a", function=CallFunction(name="lookup", arguments='{"q": 1}')),
        AssistantToolCall(id="call_b", function=CallFunction(name="fetch", arguments="{}")),
    ]
    reply = Reply.of(_done(text="", finish_reason="tool_calls", tool_calls=calls))
    assert reply.tool_calls == tuple(calls) and reply.finish_reason == "tool_calls"


def test_a_turn_without_tokens_has_no_first_token_time_and_a_stateless_one_no_message():
    reply = Reply.of(_done(message_id=None, text="", finish_reason="error", timings=Timings()))
    assert reply.ttft_ms is None and reply.message_id is None and reply.decode_tokens_per_s == 0.0
