"""Legacy completions' requests (``chat/server/surfaces/completions_api.py``): fields not honoured refused by name,
one turn per prompt and reply (seeded one apart), prompts of text or token ids checked before anything runs.
(Over HTTP: tests/chat/server/test_openai_surface.py; the bytes: test_wire_bodies.py.)"""

from __future__ import annotations

import pytest

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.surfaces.completions_api import CompletionRequest, build_turns, prompt_ids
from tests.chat.engine.fakes import FakeRuntime


def request(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "ab", **fields})


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"n": 3}, "n", ErrorCode.INVALID_SAMPLING),
        ({"n": 2, "best_of": 3}, "best_of", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"suffix": "x"}, "suffix", ErrorCode.UNSUPPORTED_PARAMETER),
        ({"user": "u"}, "user", ErrorCode.UNSUPPORTED_PARAMETER),
    ],
)
def test_fields_not_honoured_and_n_past_the_servers_max_are_refused_by_name(fields, param, code):
    request(n=2, best_of=2).check(max_n=2)
    with pytest.raises(RequestError) as info:
        request(**fields).check(max_n=2)
    assert (info.value.code, info.value.param) == (code, param)


def test_one_turn_per_prompt_and_reply_in_choice_order_each_seeded_one_apart():
    turns = build_turns(request(prompt=["ab", "c"], n=2, seed=9), "salt", FakeRuntime())
    assert [list(t.prompt_tokens) for t in turns] == [[97, 98], [97, 98], [99], [99]]
    assert [t.params.seed for t in turns] == [9, 10, 9, 10] and {t.salt for t in turns} == {"salt"}
    ids = build_turns(request(prompt=[[5, 6, 7], [8]]), "", FakeRuntime())  # token-id prompts as they are
    assert [list(t.prompt_tokens) for t in ids] == [[5, 6, 7], [8]]


def test_max_tokens_0_and_echoed_logprobs_ask_for_the_prompt_only():
    (turn,) = build_turns(request(max_tokens=0, echo=True, logprobs=2), "", FakeRuntime())
    assert turn.params.max_tokens == 0 and turn.params.prompt_logprobs and turn.params.top_logprobs == 2


@pytest.mark.parametrize(
    ("prompt", "code"),
    [
        ([], ErrorCode.INVALID_REQUEST),  # no prompt
        ([""], ErrorCode.INVALID_REQUEST),  # an empty one
        ([5, -1], ErrorCode.INVALID_REQUEST),  # an id outside the vocabulary
        ("x" * 5000, ErrorCode.CONTEXT_OVERFLOW),  # fills the context window
    ],
)
def test_a_bad_prompt_is_refused_naming_prompt(prompt, code):
    with pytest.raises(RequestError) as info:
        build_turns(request(prompt=prompt), "", FakeRuntime())
    assert (info.value.code, info.value.param) == (code, "prompt")


def test_a_prompt_string_gets_the_tokenizers_own_special_tokens():
    class Bos(FakeRuntime):
        def encode_prompt(self, text):
            return [1, *self.encode(text)]

    assert prompt_ids(Bos(), "ab") == [1, 97, 98] and prompt_ids(FakeRuntime(), "ab") == [97, 98]
