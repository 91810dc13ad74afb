"""chat.engine.recent_replies: a reuse that stopped inside a remembered reply, which the conversation holds back, is
template drift; anything else is not. Bounded per namespace and in namespaces."""

from __future__ import annotations

from chat.engine.recent_replies import RecentReplies

PROMPT = [1, 2, 3, 4]
REPLY = [7, 8, 9]
TEXT = "<think>hm</think>The answer."
HELD = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer."}]


def replies_with_one() -> RecentReplies:
    replies = RecentReplies()
    replies.record("ns", PROMPT, REPLY, TEXT)
    return replies


def test_reuse_stopping_inside_a_reply_the_conversation_holds_is_drift():
    replies = replies_with_one()
    follow_up = [*PROMPT, 7, 99, 5]  # the template re-rendered the reply from its second token on
    for k in (4, 5):  # at the reply's first token, and inside it
        assert replies.drift_at("ns", follow_up, k, HELD)
    assert replies.drift_at("ns", [*PROMPT, 7, 8, 99], 6, HELD)  # its last token


def test_reuse_stopping_outside_the_reply_or_off_its_tokens_is_not_drift():
    replies = replies_with_one()
    assert not replies.drift_at("ns", PROMPT + REPLY + [5], 3, HELD)  # before the reply
    assert not replies.drift_at("ns", PROMPT + REPLY + [5], 7, HELD)  # after it
    assert not replies.drift_at("ns", [*PROMPT, 6, 8], 5, HELD)  # the prompt does not follow the reply up to k
    assert not replies.drift_at("ns", [1, 2, 0, 4, 7, 99], 5, HELD)  # another prompt before it
    assert not replies.drift_at("ns", PROMPT, 5, HELD)  # a prompt shorter than k
    assert not replies.drift_at("other", [*PROMPT, 7, 99], 5, HELD)  # another namespace


def test_the_conversation_must_hold_the_reply_by_its_text_its_end_or_its_calls():
    replies = replies_with_one()
    prompt = [*PROMPT, 7, 99]
    assert replies.drift_at("ns", prompt, 5, [{"role": "assistant", "content": TEXT}])
    assert not replies.drift_at("ns", prompt, 5, [{"role": "assistant", "content": "Another answer."}])  # edited
    assert not replies.drift_at("ns", prompt, 5, [{"role": "user", "content": "The answer."}])  # not the reply
    assert not replies.drift_at("ns", prompt, 5, [{"role": "assistant", "content": "  "}])  # blank holds nothing
    called = RecentReplies()
    called.record("ns", PROMPT, REPLY, '<tool_call>{"name": "get_weather"}</tool_call>')
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_weather"}}]}]
    assert called.drift_at("ns", prompt, 5, calls)
    other = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_time"}}]}]
    assert not called.drift_at("ns", prompt, 5, other)


def test_an_empty_reply_is_not_remembered():
    replies = RecentReplies()
    replies.record("ns", PROMPT, [], "")
    assert not replies.drift_at("ns", [*PROMPT, 7], 4, [{"role": "assistant", "content": "x"}])


def test_the_oldest_reply_and_the_least_recently_used_namespace_are_forgotten():
    replies = RecentReplies(per_namespace=2, namespaces=2)
    replies.record("a", PROMPT, REPLY, TEXT)
    for other in ([5, 5], [6, 6]):
        replies.record("a", other, [1], "x")
    assert not replies.drift_at("a", [*PROMPT, 7, 99], 5, HELD)  # pushed out by two newer replies
    replies.record("b", PROMPT, REPLY, TEXT)
    replies.record("c", PROMPT, REPLY, TEXT)  # a third namespace: "a" is the least recently used
    assert replies.drift_at("b", [*PROMPT, 7, 99], 5, HELD) and replies.drift_at("c", [*PROMPT, 7, 99], 5, HELD)
    assert not replies.drift_at("a", [5, 5, 1, 0], 3, [{"role": "assistant", "content": "x"}])
    replies.record("b", [0], [1], "y")  # "b" used again: "c" goes next
    replies.record("d", PROMPT, REPLY, TEXT)
    assert replies.drift_at("b", [*PROMPT, 7, 99], 5, HELD)
    assert not replies.drift_at("c", [*PROMPT, 7, 99], 5, HELD)
