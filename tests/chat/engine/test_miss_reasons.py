"""Why reuse stopped where it did, for the reasons that need more than the live index: a media item that changed,
a longer match that was evicted, and a chat template that re-rendered a recent reply otherwise (template drift).
Each case also checks what it would have been called without that reason (``diverged`` or ``cold``)."""

from __future__ import annotations

import io

from PIL import Image

from cache import PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.recent_replies import RecentReplies
from chat.engine.sampling import SamplingParams
from chat.engine.turn import MISS_REASONS, Turn, run_to_end
from modalities.parts import MediaInput
from tests.chat.engine.fakes import FakeMediaRuntime, FakeRuntime


def _ask(runtime, cache, messages, replies=None, max_tokens=40):
    turn = Turn(runtime, cache, TurnRequest(messages, SamplingParams(max_tokens=max_tokens)), replies=replies)
    return run_to_end(turn)[1]


def _png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


def _with_image(colour) -> list[dict]:
    picture = MediaInput.from_bytes("image", _png(colour), item="messages[1].content[1]")
    return [
        {"role": "system", "content": "describe"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, picture]},
    ]


def test_a_changed_image_is_named_where_it_stands():
    runtime, cache = FakeMediaRuntime(), PrefixCache()
    _ask(runtime, cache, _with_image((200, 0, 0)))
    usage = _ask(runtime, cache, _with_image((0, 0, 200))).usage
    start = len(runtime.render_prompt(_with_image((0, 0, 200))[:1]).tokens) - 1 + 1 + len("what is this?")
    assert (usage.cache_miss_reason, usage.cache_miss_at) == ("media_changed", start)
    assert usage.cached_tokens == start
    text_instead = [_with_image((0, 0, 0))[0], {"role": "user", "content": "what is this?" + "x" * 12}]
    assert _ask(runtime, cache, text_instead).usage.cache_miss_reason == "diverged"  # no image there: not media


def test_a_longer_match_that_was_evicted_is_told_from_a_cold_prompt():
    runtime, cache = FakeRuntime(), PrefixCache()
    first = [{"role": "system", "content": "be brief " * 8}, {"role": "user", "content": "hello there"}]
    reply = _ask(runtime, cache, first).text
    assert cache.evict() > 0
    later = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    usage = _ask(runtime, cache, later).usage
    assert (usage.cache_miss_reason, usage.cache_miss_at, usage.cached_tokens) == ("evicted", 0, 0)
    other = PrefixCache()  # the same prompt on a cache that never held it
    assert _ask(runtime, other, later).usage.cache_miss_reason == "cold"


def _after_a_thinking_reply(answer_as, record: bool = True):
    """A thinking reply, then a turn whose history gives it back as ``answer_as(reply)``; that turn's usage."""
    runtime = FakeRuntime(drift=True, script=lambda prompt: "<think>hmm, two</think>It is two.")
    cache, replies = PrefixCache(), RecentReplies() if record else None
    first = [{"role": "user", "content": "1+1?"}]
    done = _ask(runtime, cache, first, replies)
    later = [*first, {"role": "assistant", "content": answer_as(done.text)}, {"role": "user", "content": "and 2+2?"}]
    return _ask(runtime, cache, later, replies).usage, len(runtime.render(first))


def test_a_reply_the_template_renders_otherwise_is_template_drift_and_an_edited_one_is_not():
    usage, prompt = _after_a_thinking_reply(lambda text: text)  # the template drops the thinking the model wrote
    assert (usage.cache_miss_reason, usage.cache_miss_at, usage.cached_tokens) == ("template_drift", prompt, prompt)
    usage, _ = _after_a_thinking_reply(lambda text: "It is two.")  # as OpenAI clients send it back: the answer
    assert usage.cache_miss_reason == "template_drift"
    usage, _ = _after_a_thinking_reply(lambda text: "It is three.")  # edited: not what the model wrote
    assert usage.cache_miss_reason == "diverged"
    usage, _ = _after_a_thinking_reply(lambda text: text, record=False)  # without the record of replies
    assert usage.cache_miss_reason == "diverged"


def test_another_tenants_reply_is_no_drift_and_there_is_no_other_tenant_reason():
    runtime = FakeRuntime(drift=True, script=lambda prompt: "<think>hmm</think>Yes.")
    cache, replies = PrefixCache(), RecentReplies()
    first = [{"role": "user", "content": "ok?"}]
    done = run_to_end(Turn(runtime, cache, TurnRequest(first, SamplingParams(), salt="alice"), replies=replies))[1]
    kept = [*first, {"role": "assistant", "content": done.text}, {"role": "user", "content": "sure?"}]
    bob = run_to_end(Turn(runtime, cache, TurnRequest(kept, SamplingParams(), salt="bob"), replies=replies))[1]
    assert bob.usage.cache_miss_reason == "cold"  # bob learns nothing of what alice holds
    assert not any("tenant" in reason for reason in MISS_REASONS)


def test_both_docs_list_every_reason():
    import re
    from pathlib import Path

    docs = Path(__file__).parents[3] / "docs"
    for name, heading in (("openai.md", "## Why reuse stopped where it did"), ("protocol.md", "### reply.done")):
        section = (docs / name).read_text().split(heading, 1)[1].split("\n#", 1)[0]
        assert set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M)) == set(MISS_REASONS), name
