"""Media by URL (opt-in): fetched images inlined into requests (``chat.server.transport.media_urls``; the fetch
rules: test_url_fetch.py), and the HTTP API inlining fetched images so that an image by URL and the same image by data
URL are one cache item."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
import torch

from chat.server.transport.media_urls import inline_urls
from chat.server.transport.url_fetch import (
    MediaURLError,
)
from tests.chat.server.transport.conftest import PNG, Images, policy_for


def test_inlining_fetches_each_url_once_and_names_the_failing_part(image_host):
    port = image_host[0]
    url = f"https://localhost:{port}/cat.png"
    part = {"type": "image_url", "image_url": {"url": url}}
    body = {
        "messages": [
            {"role": "user", "content": [dict(part, image_url=dict(part["image_url"]))]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, dict(part, image_url=dict(part["image_url"]))]},
        ]
    }
    before = Images.hits
    assert asyncio.run(inline_urls("/v1/chat/completions", body, policy_for(image_host)))
    assert Images.hits - before == 1
    inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert [m["content"][-1]["image_url"]["url"] for m in body["messages"]] == [inline, inline]
    body["messages"][1]["content"][1]["image_url"]["url"] = f"https://localhost:{port}/page"
    with pytest.raises(MediaURLError) as info:
        asyncio.run(inline_urls("/v1/chat/completions", body, policy_for(image_host)))
    assert info.value.item == "messages[1].content[1]"
    responses_body = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]}
    assert asyncio.run(inline_urls("/v1/responses", responses_body, policy_for(image_host)))
    assert responses_body["input"][0]["content"][0]["image_url"] == inline
    block = {"type": "image", "source": {"type": "url", "url": url}}
    messages_body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, block]}]}
    assert asyncio.run(inline_urls("/v1/messages", messages_body, policy_for(image_host)))
    assert messages_body["messages"][0]["content"][1]["source"] == {"type": "url", "url": inline}


# ---- end to end: the HTTP API on a multimodal model ----


@pytest.fixture(scope="module")
def omni_with_urls(image_host):
    from chat.models import load_model
    from tests.chat.server.conftest import make_server

    torch.set_num_threads(1)
    runtime = load_model("tiny-omni")
    port, ca = image_host
    engine, srv = make_server(
        runtime=runtime,
        media_url_hosts=[f"localhost:{port}"],
        media_url_allow_private=True,
        media_url_ca_file=ca,
        auth_token="secret",
    )
    with srv:
        yield srv, runtime
    engine.close()


def _chat(srv, image: str, token: str | None = "secret") -> httpx.Response:
    content = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": image}}]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]
    body = {"model": "tiny-omni", "max_tokens": 1, "temperature": 0, "messages": messages}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_an_image_by_url_and_by_data_url_is_one_cache_item(omni_with_urls, image_host):
    srv, runtime = omni_with_urls
    url = f"https://localhost:{image_host[0]}/cat.png"
    encoded = runtime.media_counters["encoded"]
    first = _chat(srv, url)
    assert first.status_code == 200, first.text
    second = _chat(srv, "data:image/png;base64," + base64.b64encode(PNG).decode())
    assert second.status_code == 200, second.text
    prompt = first.json()["usage"]["prompt_tokens"]
    assert second.json()["usage"]["prompt_tokens"] == prompt
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1  # all but the last token
    assert runtime.media_counters["encoded"] - encoded == 1


def test_refusals_over_http(omni_with_urls, image_host):
    srv, _ = omni_with_urls
    port = image_host[0]
    before = Images.hits
    assert _chat(srv, f"https://localhost:{port}/cat.png", token=None).status_code == 401
    assert Images.hits == before  # no key, no fetch
    bad = _chat(srv, f"https://localhost:{port}/page")
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["code"] == "invalid_media" and error["param"] == "messages[1].content[1]"
    assert "not an image" in error["message"]
    other = _chat(srv, "https://images.example.com/cat.png")
    assert other.status_code == 400 and "not on this server's list" in other.json()["error"]["message"]


def test_an_anthropic_image_block_by_url_is_fetched_and_a_bad_one_refused_in_anthropics_shape(
    omni_with_urls, image_host
):
    srv, _ = omni_with_urls
    port = image_host[0]

    def post(url: str) -> httpx.Response:
        content = [{"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "what is it?"}]
        body = {"model": "tiny-omni", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
        return httpx.post(srv.url + "/v1/messages", json=body, headers={"x-api-key": "secret"}, timeout=60)

    good = post(f"https://localhost:{port}/cat.png")
    assert good.status_code == 200, good.text
    bad = post(f"https://localhost:{port}/page")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in bad.json()["error"]["message"]


def test_without_hosts_a_url_is_refused_by_validation():
    from tests.chat.server.conftest import make_server

    engine, srv = make_server()
    with srv:
        response = _chat(srv, "https://images.example.com/cat.png", token=None)
    engine.close()
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_media" and "--media-url-host" in error["message"]
