"""Thinking replies over HTTP: reasoning_content apart from content (whole and streamed), structured output after
the thinking, chat_template_kwargs reaching the template, and typed refusals of a bad thinking budget."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from chat.engine.reasoning import Markers
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

USER = [{"role": "user", "content": "What is 2 + 2?"}]


class ThinkingFake(FakeRuntime):
    reasoning = Markers()


@pytest.fixture
def thinker():
    script = lambda prompt: '<think>\nTwo and two.\n</think>\n\n{"n":4} is it'  # noqa: E731
    engine, srv = make_server(runtime=ThinkingFake(script=script))
    with srv:
        yield srv
    engine.close()


def test_reasoning_comes_apart_from_the_answer(thinker):
    client = openai.OpenAI(base_url=f"{thinker.url}/v1", api_key="unused")
    reply = client.chat.completions.create(model="fake", messages=USER, max_tokens=200)
    message = reply.choices[0].message
    assert message.content == '{"n":4} is it' and message.model_extra["reasoning_content"] == "Two and two."
    chunks = list(client.chat.completions.create(model="fake", messages=USER, max_tokens=200, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "Two and two."
    assert "".join(d.content or "" for d in deltas) == '{"n":4} is it'


def test_structured_output_applies_to_the_answer_only(thinker):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = httpx.post(
        f"{thinker.url}/v1/chat/completions",
        json={"messages": USER, "response_format": fmt, "max_tokens": 200},
        timeout=30,
    )
    message = r.json()["choices"][0]["message"]
    assert json.loads(message["content"]) == {"n": 4} and message["reasoning_content"] == "Two and two."


def test_chat_template_kwargs_reach_the_template():
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = load_model("tiny-thinking")
    engine = Engine(runtime, cache=PrefixCache())
    with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as srv:

        def ask(**extra):
            body = {"messages": USER, "max_tokens": 4, "temperature": 0, **extra}
            return httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)

        thinking, plain = ask(), ask(chat_template_kwargs={"enable_thinking": False})
        assert plain.json()["usage"]["prompt_tokens"] > thinking.json()["usage"]["prompt_tokens"]  # the empty block
        budget = ask(thinking_budget=3, max_tokens=30, response_format={"type": "json_object"})
        message = budget.json()["choices"][0]["message"]
        if budget.json()["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(message["content"]), dict)
        bad = ask(thinking_budget=3, chat_template_kwargs={"enable_thinking": False})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "thinking_budget"
        over = ask(thinking_budget=10_000)
        assert over.status_code == 400 and over.json()["error"]["code"] == "context_overflow"
    engine.close()


def test_a_model_that_does_not_think_refuses_a_thinking_budget(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": USER, "thinking_budget": 5}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_budget"


def test_the_next_turn_finds_the_answer_without_its_thinking_in_the_cache(thinker):
    """The template drops the thinking from history; the server computes the conversation as it will be rendered
    once the reply is out, so the next turn reuses the answer too, not just the earlier prompt."""
    import time

    client = openai.OpenAI(base_url=f"{thinker.url}/v1", api_key="unused")
    first = client.chat.completions.create(model="fake", messages=USER, max_tokens=200)
    answer = first.choices[0].message.content
    follow = [*USER, {"role": "assistant", "content": answer}, {"role": "user", "content": "and 3 + 3?"}]
    rendered = ThinkingFake().render(follow)
    settled = len(ThinkingFake().render(follow[:2], add_generation_prompt=False))  # the history with the answer
    deadline = time.monotonic() + 10
    while httpx.get(f"{thinker.url}/health").json()["active_turns"] and time.monotonic() < deadline:
        time.sleep(0.01)  # the settling turn runs after the reply is out
    second = client.chat.completions.create(model="fake", messages=follow, max_tokens=200)
    assert second.usage.prompt_tokens == len(rendered)
    assert second.usage.prompt_tokens_details.cached_tokens >= settled > first.usage.prompt_tokens


def _idle(server) -> None:
    import time

    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/health").json()["active_turns"] and time.monotonic() < deadline:
        time.sleep(0.01)  # the settling turn runs after the reply is out


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_reply_that_thought_is_settled_whole_or_streamed(thinker, stream):
    """/v1/responses goes through the one reply reader, whose settle step every surface shares: the next response
    (``previous_response_id``) finds the answer without its thinking in the cache, streamed or not (the streamed path
    once lacked the settle step, and computed the answer again)."""
    client = openai.OpenAI(base_url=f"{thinker.url}/v1", api_key="unused")
    if stream:
        events = list(client.responses.create(model="fake", input=USER, max_output_tokens=200, stream=True))
        first = events[-1].response
    else:
        first = client.responses.create(model="fake", input=USER, max_output_tokens=200)
    answer = first.output_text
    history = [*USER, {"role": "assistant", "content": answer}]
    settled = len(ThinkingFake().render(history, add_generation_prompt=False))  # the history with the answer
    _idle(thinker)
    second = client.responses.create(
        model="fake", input="and 3 + 3?", previous_response_id=first.id, max_output_tokens=200
    )
    assert second.usage.input_tokens_details.cached_tokens >= settled > first.usage.input_tokens
