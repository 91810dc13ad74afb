"""Chat completions' wire models (``chat/server/surfaces/openai_types.py``): JSON that leaves out only the None
fields a class lists, and a request's usage summed over its replies. (Every surface's bytes: test_wire_bodies.py.)"""

from __future__ import annotations

import orjson
import pytest

from chat.engine.events import Done, Timings, Usage
from chat.server.surfaces import openai_types as wire


def test_only_the_listed_none_fields_are_left_out():
    details = wire.PromptTokensDetails(cached_tokens=3)
    assert orjson.loads(wire.encode(details)) == {"cached_tokens": 3}
    missed = wire.PromptTokensDetails(cached_tokens=3, cache_miss_reason="cold", cache_miss_at=0)
    assert orjson.loads(wire.encode(missed)) == {"cached_tokens": 3, "cache_miss_reason": "cold", "cache_miss_at": 0}
    message = wire.ChatCompletionMessage(content=None)  # content is not listed: null is sent
    assert orjson.loads(wire.encode(message))["content"] is None
    with pytest.raises(TypeError):
        wire.encode(object())


def done(completion: int, cached: int = 2, reason: str | None = None) -> Done:
    usage = Usage(10, cached, completion, cache_miss_reason=reason, cache_miss_at=4 if reason else None)
    return Done(
        "x",
        (1,),
        "stop",
        usage,
        Timings(ttft_ms=1.5, prefill_ms=1.0, decode_tokens_per_s=20.0, total_ms=9.0 + completion),
    )


def test_a_requests_usage_counts_the_prompt_once_and_every_replys_tokens():
    usage, timings = wire.usage_of([done(3, reason="cold"), done(5)])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (10, 8, 18)
    assert usage.prompt_tokens_details == wire.PromptTokensDetails(
        cached_tokens=2, cache_miss_reason="cold", cache_miss_at=4
    )  # the first reply's
    assert (timings.ttft_ms, timings.prefill_ms, timings.total_ms) == (1.5, 1.0, 12.0)  # the first reply's
