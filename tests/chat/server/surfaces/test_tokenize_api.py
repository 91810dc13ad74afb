"""``/tokenize`` and ``/detokenize``'s bodies (``chat/server/surfaces/tokenize_api.py``): exactly one of a prompt or
messages, messages rendered as the template renders them (``developer`` as ``system``), ids outside the vocabulary
refused by name, and a base model's messages refused. (Through the app: tests/chat/server/routes/test_tokens.py.)"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chat.engine.errors import NoChatTemplateError
from chat.server.errors import RequestError
from chat.server.surfaces.tokenize_api import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from tests.chat.engine.fakes import FakeRuntime


@pytest.mark.parametrize("body", [{}, {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}])
def test_exactly_one_of_prompt_and_messages(body):
    with pytest.raises(ValidationError, match="exactly one"):
        TokenizeRequest.model_validate(body)


def test_messages_are_rendered_with_developer_as_system_and_the_generation_prompt_optional():
    runtime = FakeRuntime()
    asked = [{"role": "developer", "content": "rules"}, {"role": "user", "content": "hi"}]
    as_system = [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]
    got = tokenize(TokenizeRequest(messages=asked), runtime)
    assert got["tokens"] == list(runtime.render(as_system)) and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == runtime.context_window
    bare = tokenize(TokenizeRequest(messages=asked, add_generation_prompt=False), runtime)
    assert bare["tokens"] == list(runtime.render(as_system, add_generation_prompt=False)) != got["tokens"]


def test_a_base_model_tokenizes_a_prompt_but_refuses_messages():
    base = FakeRuntime()
    base.chats = False  # a base model: no chat template
    assert tokenize(TokenizeRequest(prompt="ab"), base)["tokens"] == [97, 98]
    with pytest.raises(NoChatTemplateError):
        tokenize(TokenizeRequest(messages=[{"role": "user", "content": "hi"}]), base)


def test_an_id_outside_the_vocabulary_is_refused_naming_tokens():
    runtime = FakeRuntime()
    assert detokenize(DetokenizeRequest(tokens=[104, 105]), runtime) == {"prompt": "hi"}
    for bad in (-1, runtime.vocab_size):
        with pytest.raises(RequestError) as info:
            detokenize(DetokenizeRequest(tokens=[104, bad]), runtime)
        assert info.value.param == "tokens" and str(bad) in str(info.value)
