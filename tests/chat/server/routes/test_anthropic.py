"""Anthropic's routes (``chat/server/routes/anthropic.py``), through the app: ``/v1/messages`` (``?beta=true`` accepted)
and ``/v1/messages/count_tokens`` check the model and answer in Anthropic's shapes. (The Messages API with the SDK,
streams, tools, thinking and breakpoints: tests/chat/server/test_anthropic.py.)"""

from __future__ import annotations

import pytest

from tests.chat.server.routes.conftest import app_client

BODY = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def client():
    with app_client() as (_, client):
        yield client


def test_a_message_is_created_with_or_without_the_beta_query(client):
    for path in ("/v1/messages", "/v1/messages?beta=true"):
        r = client.post(path, json=BODY)
        assert r.status_code == 200 and r.json()["type"] == "message" and r.json()["usage"]["output_tokens"] == 3
    streamed = client.post("/v1/messages", json={**BODY, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.startswith("event: message_start")


def test_count_tokens_counts_the_rendered_prompt(client):
    counted = client.post("/v1/messages/count_tokens", json={k: v for k, v in BODY.items() if k != "max_tokens"})
    created = client.post("/v1/messages", json=BODY).json()["usage"]
    assert counted.json()["input_tokens"] == created["input_tokens"] + created["cache_read_input_tokens"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_an_unknown_model_is_not_found_in_anthropics_shape(client, path):
    body = BODY if path == "/v1/messages" else {k: v for k, v in BODY.items() if k != "max_tokens"}
    r = client.post(path, json={**body, "model": "claude-nope"})
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
