"""What real OpenAI clients send, over a real server (fake model): structured output through the official SDK's
``.parse()`` and LangChain's ``with_structured_output``, log-probabilities (streamed too), ``n``, ``/v1/completions``
(echo, logprobs, max_tokens 0, token-id prompts, streaming), ``/tokenize``; every field honoured or refused by name,
and a refused request touches neither the cache nor the engine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.chat.engine.fakes import FakeRuntime
from tests.chat.server.conftest import make_server

USER = [{"role": "user", "content": "hi"}]


class City(BaseModel):
    name: str
    big: bool


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


@pytest.fixture
def city_server():
    """A fake model that writes a City and then goes on talking (the grammar ends the reply with the object)."""
    engine, srv = make_server(runtime=FakeRuntime(script=lambda prompt: '{"name":"Oslo","big":true} and on'))
    with srv:
        yield srv
    engine.close()


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def test_the_sdks_parse_gets_a_validated_object(city_server):
    client = openai.OpenAI(base_url=f"{city_server.url}/v1", api_key="unused")
    completion = client.chat.completions.parse(model="fake", messages=USER, response_format=City, max_tokens=200)
    assert completion.choices[0].message.parsed == City(name="Oslo", big=True)
    assert completion.choices[0].finish_reason == "stop"
    free = client.chat.completions.create(model="fake", messages=USER, max_tokens=200)
    assert free.choices[0].message.content.endswith("and on")  # what the grammar cut


def test_langchains_structured_output_gets_a_validated_object(city_server):
    import langchain_openai  # a dev dependency

    model = langchain_openai.ChatOpenAI(
        base_url=f"{city_server.url}/v1", api_key="unused", model="fake", max_tokens=200
    )
    assert model.with_structured_output(City).invoke("a city?") == City(name="Oslo", big=True)
    as_json = model.with_structured_output(City, method="json_mode").invoke("a city as JSON?")
    assert as_json == City(name="Oslo", big=True)  # json_object constrained, then parsed by LangChain


def test_logprobs_come_per_token_whole_and_streamed(client):
    whole = client.chat.completions.create(model="fake", messages=USER, logprobs=True, top_logprobs=2, max_tokens=5)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 5
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)
    chunks = client.chat.completions.create(
        model="fake", messages=USER, logprobs=True, top_logprobs=2, max_tokens=5, stream=True
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]


def test_n_replies_are_n_choices_with_their_own_seeds(client):
    reply = client.chat.completions.create(model="fake", messages=USER, n=3, seed=5, temperature=1.0, max_tokens=4)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == sum(len(c.message.content.encode()) for c in reply.choices) == 12


def test_completions_echo_with_logprobs_and_max_tokens_zero(server):
    r = post(server.url, "/v1/completions", {"prompt": [[104, 105, 33]], "echo": True, "logprobs": 1, "max_tokens": 0})
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["text"] == "hi!" and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["h", "i", "!"] and lp["token_logprobs"][0] is None and len(lp["top_logprobs"]) == 3
    assert all(max(top.values()) >= v for top, v in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:], strict=True))


@pytest.mark.parametrize("count", [2, 5, 20])
def test_completions_logprobs_is_a_count_of_alternatives_not_a_flag(server, count):
    """``/v1/completions``' ``logprobs`` is an integer (chat's is a boolean): 5 is lm-eval's and the SDK's usual."""
    r = post(server.url, "/v1/completions", {"prompt": "ab", "logprobs": count, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 3 and all(1 <= len(top) <= count + 1 for top in lp["top_logprobs"])
    assert all(text in top for text, top in zip(lp["tokens"], lp["top_logprobs"], strict=True))
    # keyed by text: the fake model's alternatives may share one (bytes of a character cut in two all show U+FFFD)
    assert max(len(top) for top in lp["top_logprobs"]) >= 2


def test_completions_batch_of_prompts_and_n(client):
    reply = client.completions.create(model="fake", prompt=["ab", "cd"], n=2, max_tokens=3, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage.prompt_tokens == 4 and reply.usage.completion_tokens == 12


def test_completions_stream(client):
    chunks = list(client.completions.create(model="fake", prompt="ab", max_tokens=3, stream=True, temperature=0))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    full = client.completions.create(model="fake", prompt="ab", max_tokens=3, temperature=0)
    assert text == full.choices[0].text and len(text) == 3


@pytest.mark.parametrize(
    ("path", "body", "code", "param"),
    [
        ("/v1/chat/completions", {"messages": USER, "frobnicate": 1}, "unknown_parameter", "frobnicate"),
        (
            "/v1/chat/completions",
            {"messages": USER, "functions": [{"name": "f"}]},
            "unsupported_parameter",
            "functions",
        ),
        ("/v1/chat/completions", {"messages": USER, "store": True}, "unsupported_parameter", "store"),
        ("/v1/chat/completions", {"messages": USER, "user": "u1"}, "unsupported_parameter", "user"),
        (
            "/v1/chat/completions",
            {"messages": [*USER, {"role": "function", "content": "x", "name": "f"}]},
            "unsupported_parameter",
            "messages.1.role",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x", "name": "bob"}]},
            "unsupported_parameter",
            "messages.0.name",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": USER,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": 7}}},
            },
            "invalid_grammar",
            "response_format",
        ),
        (
            "/v1/chat/completions",
            {"messages": USER, "structured_outputs": {"regex": "(("}},
            "invalid_grammar",
            "structured_outputs",
        ),
        (
            "/v1/chat/completions",
            {"messages": USER, "structured_outputs": {"grammar": "start: nope"}},
            "invalid_grammar",
            "structured_outputs",
        ),
        (
            "/v1/chat/completions",
            {"messages": USER, "logprobs": True, "top_logprobs": 21},
            "invalid_sampling",
            "top_logprobs",
        ),
        ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, "invalid_sampling", "top_logprobs"),
        ("/v1/chat/completions", {"messages": USER, "n": 17}, "invalid_sampling", "n"),
        ("/v1/chat/completions", {"messages": USER, "logit_bias": {"260": 1}}, "invalid_sampling", "logit_bias"),
        ("/v1/chat/completions", {"messages": USER, "logit_bias": {"a": 1}}, "invalid_sampling", "logit_bias"),
        ("/v1/chat/completions", {"messages": USER, "presence_penalty": 3}, "invalid_sampling", "presence_penalty"),
        ("/v1/completions", {"prompt": "x", "suffix": "y"}, "unsupported_parameter", "suffix"),
        ("/v1/completions", {"prompt": "x", "best_of": 3}, "unsupported_parameter", "best_of"),
        ("/v1/completions", {"prompt": [[1, 999]]}, "invalid_request", "prompt"),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "invalid_request", "logprobs"),
        ("/v1/completions", {"prompt": "x" * 5000, "echo": True, "logprobs": 1}, "context_overflow", "prompt"),
    ],
)
def test_refusals_are_typed_name_their_field_and_touch_nothing(path, body, code, param):
    engine, srv = make_server(runtime=FakeRuntime(context_window=4096))
    with srv:
        before = engine.cache_stats()
        r = post(srv.url, path, body)
        error = r.json()["error"]
        assert (r.status_code, error["code"], error["param"]) == (400, code, param), r.text
        assert engine.runtime.forwarded == 0 and engine.cache_stats() == before
    engine.close()


def test_an_unknown_field_gets_openais_words(server):
    error = post(server.url, "/v1/chat/completions", {"messages": USER, "foo": 1}).json()["error"]
    assert error["message"] == "Unrecognized request argument supplied: foo"


def test_neutral_values_of_unhonoured_fields_are_accepted(server):
    body = {
        "messages": USER,
        "store": False,
        "modalities": ["text"],
        "service_tier": "auto",
        "parallel_tool_calls": False,
    }
    assert post(server.url, "/v1/chat/completions", {**body, "max_tokens": 2}).status_code == 200


def test_a_prompt_over_the_context_is_refused_before_a_stream_starts():
    engine, srv = make_server(runtime=FakeRuntime(context_window=16))
    with srv:
        r = post(srv.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40}], "stream": True})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_overflow"
    engine.close()


def test_max_tokens_left_out_runs_to_the_server_cap_or_the_context():
    script = lambda prompt: "y" * 400  # noqa: E731
    engine, srv = make_server(runtime=FakeRuntime(script=script, context_window=64), max_reply_tokens=7)
    with srv:
        assert (
            post(srv.url, "/v1/chat/completions", {"messages": USER})["usage"]["completion_tokens"] == 7
            if False
            else True
        )
        r = post(srv.url, "/v1/chat/completions", {"messages": USER}).json()
        assert r["usage"]["completion_tokens"] == 7 and r["choices"][0]["finish_reason"] == "length"
    engine.close()
    engine, srv = make_server(runtime=FakeRuntime(script=script, context_window=64))
    with srv:
        r = post(srv.url, "/v1/chat/completions", {"messages": USER}).json()
        assert r["usage"]["total_tokens"] == 64
    engine.close()


def test_the_websocket_takes_per_turn_structured_output_and_streams_logprobs(server):
    from websockets.sync.client import connect

    with connect(server.url.replace("http", "ws") + "/v1/ws") as ws:
        ws.send(json.dumps({"type": "session.create", "sampling": {"temperature": 0, "max_tokens": 100}}))
        json.loads(ws.recv())
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        schema["additionalProperties"] = False
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
        ws.send(
            json.dumps({"type": "turn.create", "content": "hi", "sampling": {"response_format": fmt, "logprobs": True}})
        )
        deltas, done = [], None
        while done is None:
            event = json.loads(ws.recv())
            if event["type"] == "reply.delta":
                deltas.append(event)
            elif event["type"] == "reply.done":
                done = event
        assert json.loads(done["text"]) in ({"ok": True}, {"ok": False})
        assert sum(len(d["logprobs"]) for d in deltas) == done["usage"]["completion_tokens"]
        ws.send(json.dumps({"type": "turn.create", "content": "again"}))  # the next turn is free text again
        while (event := json.loads(ws.recv()))["type"] != "reply.done":
            pass
        assert event["text"].startswith("reply")
