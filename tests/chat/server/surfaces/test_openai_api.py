"""Chat completions (``chat/server/surfaces/openai_api.py``): the stream chunks written from templates are the
generic chunks; fields not honoured refused by name; ``n`` turns prepared. (Over HTTP: tests/chat/server/test_http.py
and test_openai_surface.py; the bytes: test_wire_bodies.py.)"""

from __future__ import annotations

import orjson
import pytest

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.surfaces.openai_api import ChatCompletionRequest, ChunkEncoder, prepare
from chat.server.surfaces.openai_types import ChunkLogprobs, ContentDelta, ReasoningDelta, TokenLogprob, TopLogprob
from tests.chat.engine.fakes import FakeRuntime


def test_a_content_chunk_encoded_from_its_template_is_the_generic_chunk():
    encoder = ChunkEncoder("chatcmpl-x", 123, 'm"odel')
    for text in ("plain", 'quote " and \\ and \n', "ünï ✓ \u2028", ""):
        fast, generic = encoder.content(3, text), encoder.whole(3, ContentDelta(content=text))
        assert fast.startswith(b"data: ") and fast.endswith(b"\n\n")
        assert fast == generic and orjson.loads(fast[6:])["choices"][0]["delta"] == {"content": text}
        top = [TopLogprob(token=text, logprob=-1.0, bytes=[1])]
        logprobs = ChunkLogprobs(content=[TokenLogprob(token=text, logprob=-0.5, bytes=[1], top_logprobs=top)])
        for delta, lp in ((ReasoningDelta(reasoning_content=text), None), (ContentDelta(content=text), logprobs)):
            assert encoder.encoded(3, delta, lp) == encoder.whole(3, delta, lp)


def chat_request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"n": 3}, "n", ErrorCode.INVALID_SAMPLING),
        ({"modalities": ["text", "audio"]}, "modalities", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"service_tier": "flex"}, "service_tier", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages.0.name",
         ErrorCode.UNSUPPORTED_PARAMETER),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages.0.role",
         ErrorCode.UNSUPPORTED_PARAMETER),
    ],
)  # fmt: skip
def test_fields_not_honoured_and_n_past_the_servers_max_are_refused_by_name(fields, param, code):
    chat_request(n=2, modalities=["text"], service_tier="auto", parallel_tool_calls=True).check(max_n=2)  # neutral
    with pytest.raises(RequestError) as info:
        chat_request(**fields).check(max_n=2)
    assert (info.value.code, info.value.param) == (code, param)


def test_n_turns_seeded_one_apart_with_max_completion_tokens_over_max_tokens():
    prepared = prepare(chat_request(n=3, seed=5, max_tokens=9, max_completion_tokens=4), "salt", FakeRuntime())
    assert [t.params.seed for t in prepared.turns] == [5, 6, 7]
    assert {t.params.max_tokens for t in prepared.turns} == {4} and {t.salt for t in prepared.turns} == {"salt"}
    assert prepared.markers is None and not prepared.plan.calls_possible  # no thinking, no tools
