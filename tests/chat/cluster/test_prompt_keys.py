"""Routing keys: chained block digests of the rendered prompt."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat.cluster.prompt_keys import PromptKeyer, block_digests, routing_messages
from modalities.parts import MediaInput

tokens = st.lists(st.integers(0, 50_000), max_size=200)


@given(tokens, st.integers(1, 16), st.integers(0, 200))
def test_a_prefix_has_a_prefix_of_the_digests(seq, block, cut):
    whole = block_digests(seq, "", block)
    assert len(whole) == len(seq) // block  # only full blocks
    assert block_digests(seq[:cut], "", block) == whole[: cut // block]


@given(tokens.filter(lambda s: len(s) >= 4), st.integers(0, 3))
def test_a_different_token_changes_its_block_and_every_later_one(seq, at):
    changed = list(seq)
    changed[at] += 1
    a, b = block_digests(seq, "", 2), block_digests(changed, "", 2)
    first = at // 2
    assert a[:first] == b[:first]
    assert all(x != y for x, y in zip(a[first:], b[first:], strict=True))


def test_tenants_never_share_a_digest():
    seq = list(range(64))
    assert not set(block_digests(seq, "tenant-a", 8)) & set(block_digests(seq, "tenant-b", 8))


def test_media_enter_the_key_by_content_hash():
    photo = MediaInput.from_bytes("image", b"\x89PNG one", "image/png", "messages[0].content[1]")
    other = MediaInput.from_bytes("image", b"\x89PNG two", "image/png", "messages[0].content[1]")
    message = {"role": "user", "content": [{"type": "text", "text": "look: "}, photo]}
    (text,) = routing_messages([message])
    assert text["role"] == "user" and text["content"].startswith("look: <image:")
    assert routing_messages([message]) == [text]  # deterministic
    assert routing_messages([{"role": "user", "content": [{"type": "text", "text": "look: "}, other]}]) != [text]
    assert routing_messages([{"role": "assistant", "content": None}]) == [{"role": "assistant", "content": ""}]


def test_messages_that_cannot_be_rendered_have_no_key():
    def broken(_messages):
        raise ValueError("no template")

    assert PromptKeyer(broken, 4).digests([{"role": "user", "content": "hi"}], "") == ()


@pytest.fixture(scope="module")
def tiny_llama():
    from chat.models import load_model

    return load_model("tiny-llama")


def test_each_turn_of_a_conversation_keeps_the_digests_of_the_turn_before(tiny_llama):
    keyer = PromptKeyer(tiny_llama.render, 8)
    messages = [{"role": "system", "content": "You are a helpful assistant who answers in detail."}]
    previous: tuple[int, ...] = ()
    for turn in range(4):
        messages.append({"role": "user", "content": f"question number {turn}: tell me more about the sea"})
        digests = keyer.digests(messages, "salt")
        assert len(digests) > len(previous) and digests[: len(previous)] == previous
        previous = digests
        messages.append({"role": "assistant", "content": f"answer {turn}: the sea is wide and deep and blue"})


def test_a_conversations_opening_key_is_the_same_every_turn_and_its_own(tiny_llama):
    keyer = PromptKeyer(tiny_llama.render, 8)
    system = {"role": "system", "content": "You are a helpful assistant who answers in detail, always. " * 3}

    def openings(topic: str) -> list[int]:
        messages, keys = [system], []
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn} about {topic}: tell me more, please"})
            digests, opening = keyer.keys(messages, "salt")
            assert opening in digests
            keys.append(opening)
            messages.append({"role": "assistant", "content": f"answer {turn}: {topic} is wide and deep"})
        return keys

    sea, sky = openings("the sea"), openings("the sky")
    assert len(set(sea)) == 1 and len(set(sky)) == 1  # one key per conversation, whatever the turn
    assert sea[0] != sky[0]  # conversations that share only a system prompt get different keys
    short = PromptKeyer(tiny_llama.render, 4096).keys([{"role": "user", "content": "hi"}], "salt")
    assert short == ((), None)  # shorter than a block: no key
