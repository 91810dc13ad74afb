"""The OpenAI-compatible HTTP API on a real server (loopback), with httpx and the official openai client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from chat.protocol import limits as L
from tests.chat.protocol.helpers import IMAGE_PART as IMAGE
from tests.chat.server.conftest import make_server


def chat(url: str, messages, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "fake", "messages": messages, **extra}, timeout=30)


def test_openai_client_multi_turn_reports_rising_cached_tokens(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    messages = [{"role": "user", "content": "hello"}]
    cached = []
    for follow_up in ("more", "and more"):
        reply = client.chat.completions.create(model="fake", messages=messages)
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": follow_up},
        ]
    assert cached[0] == 0 and cached[1] > 0


def test_openai_client_streams_and_the_last_chunk_has_usage(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    chunks = list(
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("reply ")
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"messages": []}, 400, "invalid_request", "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_request", None),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "invalid_sampling", "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "invalid_sampling", "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 17}, 400, "invalid_sampling", "n"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model_not_found", "model"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
            400,
            "invalid_media",
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, 400, "context_overflow", None),
        # the protocol's limits and content rules, shared with the WebSocket
        ({"messages": [{"role": "user", "content": "x" * (L.MAX_TEXT_CHARS + 1)}]}, 400, "invalid_request", None),
        ({"messages": [{"role": "user", "content": "x"}] * (L.MAX_MESSAGES + 1)}, 400, "invalid_request", "messages"),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": L.MAX_REPLY_TOKENS + 1},
            400,
            "invalid_sampling",
            "max_tokens",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, 400, "invalid_sampling", "stop"),
        (
            {"messages": [{"role": "user", "content": "x"}], "model": "m" * (L.MAX_MODEL_CHARS + 1)},
            400,
            "invalid_request",
            "model",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,QUJ"}}],
                    }
                ]
            },
            400,
            "invalid_media",
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [IMAGE]}]},
            400,
            "invalid_media",
            "messages[1]",
        ),
    ],
)
def test_bad_requests_get_typed_errors(server, body, status, code, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    assert chat(server.url, [{"role": "user", "content": "still fine"}]).status_code == 200


def test_malformed_json_and_oversized_bodies():
    engine, srv = make_server(max_body_mib=1)
    with srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            content=b"{not json",
            timeout=30,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]})
        r = httpx.post(
            f"{srv.url}/v1/chat/completions", content=big, timeout=30, headers={"content-type": "application/json"}
        )
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    engine.close()


def test_auth_token_is_required_when_set():
    engine, srv = make_server(auth_token="s3cret")
    with srv:
        body = {"messages": [{"role": "user", "content": "x"}]}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=wrong).status_code == 401
        ok = {"authorization": "Bearer s3cret"}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=ok, timeout=30).status_code == 200
        assert httpx.get(f"{srv.url}/health").status_code == 200
    engine.close()


def test_no_prefix_cache_gives_the_same_greedy_replies():
    replies = []
    for use_cache in (True, False):
        engine, srv = make_server(prefix_cache=use_cache)
        with srv:
            messages = [{"role": "user", "content": "one"}]
            out = []
            for _ in range(3):
                r = chat(srv.url, messages).json()
                out.append(
                    (r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens_details"]["cached_tokens"])
                )
                messages += [{"role": "assistant", "content": out[-1][0]}, {"role": "user", "content": "next"}]
            replies.append(out)
        engine.close()
    assert [t for t, _ in replies[0]] == [t for t, _ in replies[1]]
    assert replies[0][-1][1] > 0 and all(c == 0 for _, c in replies[1])


def test_a_shut_down_engine_is_unavailable_on_both_transports():
    import asyncio

    from websockets.asyncio.client import connect

    from tests.chat.server.surfaces.test_ws import Client, ws_url

    engine, srv = make_server()
    with srv:
        engine.close()
        r = chat(srv.url, [{"role": "user", "content": "x"}])
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"

        async def turn() -> dict:
            async with connect(ws_url(srv)) as ws:
                c = Client(ws)
                await c.send(type="session.create")
                await c.until("session.created")
                await c.send(type="turn.create", content="x")
                error, _ = await c.until("error")
                return error

        error = asyncio.run(turn())
        assert error["code"] == "unavailable" and "shut down" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_history_of_10000_messages_is_refused_before_the_engine_sees_it(stream):
    """Issue 37: a huge stateless history is refused by the message limit (linear validation), never rendered."""
    engine, srv = make_server()
    with srv:
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(10_000)]
        r = chat(srv.url, history, stream=stream)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        assert engine.metrics.turns == 0 and engine.cache.stats().lookups == 0  # nothing rendered, looked up
        assert chat(srv.url, history[-L.MAX_MESSAGES + 1 :]).status_code == 200  # the longest history allowed
    engine.close()
