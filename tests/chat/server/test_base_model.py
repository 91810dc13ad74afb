"""A base model (no chat template: ``tiny-base``, tiny-llama's weights without one) on a real server: completions,
``/tokenize`` and ``/detokenize`` serve it; chat routes, ``/v1/responses``, ``/tokenize`` of messages and WebSocket
turns answer 400 ``no_chat_template`` naming ``--chat-template``, the session and the server untouched; with
``--chat-template`` it chats, and a template that raises while rendering is a 400 ``template_error``."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from websockets.asyncio.client import connect

from chat.models import load_model
from tests.chat.server.conftest import make_server

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_SYSTEM = (  # refuses a system message with its own raise_exception, on line 2
    "{% for m in messages %}\n{% if m.role == 'system' %}{{ raise_exception('no system messages here') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)
TEXT = "one two three four five"


@pytest.fixture(scope="module")
def base():
    torch.set_num_threads(1)
    runtime = load_model("tiny-base")
    engine, srv = make_server(runtime=runtime)
    with srv:
        yield srv, runtime
    engine.close()


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def direct_logprobs(runtime, ids: list[int]) -> list[float]:
    run = runtime.new_run()
    try:
        logp = torch.log_softmax(runtime.forward(run, ids).double(), dim=-1)
    finally:
        runtime.close_run(run)
    return [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]


def assert_no_chat_template(response: httpx.Response, model: str = "tiny-base") -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "no_chat_template" and error["type"] == "invalid_request_error"
    assert "--chat-template" in error["message"] and model in error["message"]


def test_the_model_list_says_whether_the_model_chats(base):
    srv, runtime = base
    (listed,) = httpx.get(srv.url + "/v1/models").json()["data"]
    assert listed["id"] == "tiny-base" and listed["chat"] is False and runtime.chats is False
    engine, chat_srv = make_server(runtime=load_model("tiny-llama"))
    with chat_srv:
        assert httpx.get(chat_srv.url + "/v1/models").json()["data"][0]["chat"] is True
    engine.close()


def test_completions_of_a_string_and_of_token_ids_with_echo_and_logprobs(base):
    srv, runtime = base
    ids = runtime.encode(TEXT)
    want = direct_logprobs(runtime, ids)
    for prompt in (TEXT, ids):
        r = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1})
        assert r.status_code == 200, r.text
        (choice,) = r.json()["choices"]
        assert choice["text"] == TEXT
        got = choice["logprobs"]["token_logprobs"]
        assert got[0] is None and got[1:] == pytest.approx(want, abs=1e-4)


def test_greedy_completion_streamed_and_not_is_the_models_own(base):
    srv, runtime = base
    ids = runtime.encode(TEXT)
    run, out = runtime.new_run(), []
    logits = runtime.forward(run, ids, last_only=True)
    for _ in range(6):
        token = int(logits[-1].argmax())
        if token in runtime.eos_token_ids:
            break
        out.append(token)
        logits = runtime.forward(run, [token], last_only=True)
    runtime.close_run(run)
    body = {"prompt": TEXT, "max_tokens": 6, "temperature": 0}
    plain = post(srv, "/v1/completions", body).json()["choices"][0]["text"]
    with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        chunks = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    streamed = "".join(json.loads(c)["choices"][0]["text"] for c in chunks[:-1])
    assert plain == streamed == runtime.decode(out)


def test_tokenize_a_prompt_and_detokenize_work_messages_are_refused(base):
    srv, runtime = base
    r = post(srv, "/tokenize", {"prompt": TEXT})
    assert r.status_code == 200 and r.json()["tokens"] == runtime.encode(TEXT)
    assert post(srv, "/detokenize", {"tokens": runtime.encode(TEXT)}).json()["prompt"] == TEXT
    assert_no_chat_template(post(srv, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}))


def test_chat_routes_and_responses_answer_no_chat_template(base):
    srv, _ = base
    messages = [{"role": "user", "content": "hi"}]
    assert_no_chat_template(post(srv, "/v1/chat/completions", {"messages": messages}))
    assert_no_chat_template(post(srv, "/v1/chat/completions", {"messages": messages, "stream": True}))
    assert_no_chat_template(post(srv, "/v1/responses", {"input": "hi"}))
    assert httpx.get(srv.url + "/health").json()["status"] == "ok"  # the server goes on
    assert post(srv, "/v1/completions", {"prompt": TEXT, "max_tokens": 1}).status_code == 200


def test_anthropic_messages_and_count_tokens_answer_no_chat_template_in_anthropics_shape(base):
    srv, _ = base
    body = {"model": "tiny-base", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for path, request in (
        ("/v1/messages", body),
        ("/v1/messages", {**body, "stream": True}),
        ("/v1/messages/count_tokens", {"model": "tiny-base", "messages": body["messages"]}),
    ):
        r = post(srv, path, request)
        assert r.status_code == 400, (path, r.text)
        answer = r.json()
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error", answer
        assert "--chat-template" in answer["error"]["message"], answer
    assert post(srv, "/v1/completions", {"prompt": TEXT, "max_tokens": 1}).status_code == 200


def test_a_websocket_turn_gets_a_typed_error_and_the_session_is_untouched(base):
    srv, _ = base
    url = srv.url.replace("http://", "ws://") + "/v1/ws"

    async def recv(ws) -> dict:
        return json.loads(await asyncio.wait_for(ws.recv(), 30))

    async def scenario():
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "session.create", "system": "be brief", "event_id": "s"}))
            created = await recv(ws)
            assert created["type"] == "session.created"
            for event in (
                {"type": "turn.create", "content": "hi", "event_id": "t1"},
                {"type": "completion.create", "messages": [{"role": "user", "content": "hi"}], "event_id": "t2"},
            ):
                await ws.send(json.dumps(event))
                error = await recv(ws)
                assert error["type"] == "error" and error["code"] == "no_chat_template", error
                assert error["reply_to"] == event["event_id"] and "--chat-template" in error["message"]
            await ws.send(json.dumps({"type": "session.resume", "session_id": created["session"]["id"]}))
            resumed = await recv(ws)
            assert resumed["type"] == "session.resumed", resumed
            assert resumed["session"]["messages"] == created["session"]["messages"]  # no user message was added

    asyncio.run(scenario())


def test_with_a_chat_template_the_base_model_chats():
    torch.set_num_threads(1)
    runtime = load_model("tiny-base", chat_template=CHATML)
    engine, srv = make_server(runtime=runtime)
    with srv:
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["chat"] is True
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
        r = post(srv, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        tokens = post(srv, "/tokenize", {"messages": body["messages"]}).json()["tokens"]
        assert tokens == runtime.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    engine.close()


def test_a_template_that_raises_is_a_typed_400_naming_its_error():
    torch.set_num_threads(1)
    runtime = load_model("tiny-base", chat_template=NO_SYSTEM)
    engine, srv = make_server(runtime=runtime)
    with srv:
        user = {"role": "user", "content": "hi"}
        for path in ("/v1/chat/completions", "/tokenize"):
            r = post(
                srv,
                path,
                {"messages": [{"role": "system", "content": "x"}, user], "max_tokens": 1}
                if path != "/tokenize"
                else {"messages": [{"role": "system", "content": "x"}, user]},
            )
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "template_error"
            assert "no system messages here" in error["message"] and "line 2" in error["message"], error
        ok = post(srv, "/v1/chat/completions", {"messages": [user], "max_tokens": 1})
        assert ok.status_code == 200, ok.text  # the same server, the next request: unharmed
    engine.close()
