"""Media by URL (opt-in): the fetch rules of ``chat.server.transport.url_fetch`` against a local HTTPS server in the
test process, and the HTTP API inlining fetched images so that an image by URL and the same image by data URL are one
cache item."""

from __future__ import annotations

import asyncio
import base64
import http.server
import shutil
import ssl
import subprocess
import threading
import time

import httpx
import pytest
import torch

from chat.server.transport.media_urls import inline_urls
from chat.server.transport.url_fetch import (
    MediaURLError,
    MediaURLPolicy,
    check_address,
    check_hosts,
    fetch_image,
    parse_target,
)
from tests.chat.models.mm_helpers import png

LIMIT = 64 * 1024
PNG = png(5)


class Images(http.server.BaseHTTPRequestHandler):
    """Routes of the test image host; ``hits`` counts requests."""

    hits = 0

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str | None, length: bool = True, **headers) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if length:
            self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        type(self).hits += 1
        port = self.server.server_address[1]
        routes = {
            "/cat.png": lambda: self._send(200, PNG, "image/png"),
            "/untyped": lambda: self._send(200, PNG, "application/octet-stream"),
            "/page": lambda: self._send(200, b"<html>hi</html>", "text/html"),
            "/text-bytes": lambda: self._send(200, b"just text", None),
            "/big": lambda: self._send(200, b"\x89PNG" + bytes(2 * LIMIT), "image/png"),
            "/big-unsized": lambda: self._send(200, b"\x89PNG" + bytes(2 * LIMIT), "image/png", length=False),
            "/same-host": lambda: self._send(302, b"", None, Location="/cat.png"),
            "/other-host": lambda: self._send(302, b"", None, Location=f"https://127.0.0.1:{port}/cat.png"),
            "/loop": lambda: self._send(302, b"", None, Location="/loop"),
            "/missing": lambda: self._send(404, b"no", "text/plain"),
        }
        if self.path == "/slow":
            time.sleep(3)
            return self._send(200, PNG, "image/png")
        routes.get(self.path, routes["/missing"])()
        if self.path == "/big-unsized":
            self.close_connection = True


@pytest.fixture(scope="module")
def image_host(tmp_path_factory):
    """(port, CA file) of an HTTPS server on 127.0.0.1 with a self-signed certificate for 'localhost'."""
    if shutil.which("openssl") is None:
        pytest.fail("these tests need the openssl command to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], str(cert)
    server.shutdown()


def policy_for(image_host, **overrides) -> MediaURLPolicy:
    port, ca = image_host
    values = dict(hosts=(f"localhost:{port}",), max_bytes=LIMIT, timeout_s=1.5, allow_private=True, ca_file=ca)
    return MediaURLPolicy(**{**values, **overrides})


def fetch(image_host, path: str, **overrides):
    return asyncio.run(fetch_image(f"https://localhost:{image_host[0]}{path}", policy_for(image_host, **overrides)))


def refusal(image_host, path: str, **overrides) -> str:
    with pytest.raises(MediaURLError) as info:
        fetch(image_host, path, **overrides)
    return str(info.value)


def test_an_image_is_fetched_with_its_type(image_host):
    got = fetch(image_host, "/cat.png")
    assert got.data == PNG and got.mime == "image/png"
    assert fetch(image_host, "/untyped").mime == "image/png"  # no useful Content-Type: the bytes decide
    assert fetch(image_host, "/same-host").data == PNG  # a redirect on the same host is followed


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/page", "'text/html', not an image"),
        ("/text-bytes", "not an image"),
        ("/big", f"over {LIMIT} bytes"),
        ("/big-unsized", f"over {LIMIT} bytes"),
        ("/other-host", "redirected to another host (127.0.0.1:"),
        ("/loop", "more than 3 redirects"),
        ("/missing", "HTTP 404"),
        ("/slow", "longer than 1.5 s"),
    ],
)
def test_what_the_host_sends_can_be_refused(image_host, path, words):
    assert words in refusal(image_host, path)


def test_private_addresses_are_refused_unless_allowed(image_host):
    before = Images.hits
    assert "not public" in refusal(image_host, "/cat.png", allow_private=False)
    assert Images.hits == before  # refused before connecting


def test_an_untrusted_certificate_fails_the_fetch(image_host):
    assert "fetch failed" in refusal(image_host, "/cat.png", ca_file=None)  # the system's CAs do not know it


def test_urls_are_checked_before_any_lookup(image_host):
    port = image_host[0]
    policy = policy_for(image_host)
    cases = {
        f"http://localhost:{port}/cat.png": "only https://",
        f"https://user:pw@localhost:{port}/cat.png": "user name or password",
        f"https://127.0.0.1:{port}/cat.png": "not on this server's list",
        "https://localhost/cat.png": "localhost:443 is not on",  # the listed port only
        "https://localhost:99999/x": "does not parse",
        "https://" + "a" * 3000: "longer than 2048",
    }
    for url, words in cases.items():
        with pytest.raises(MediaURLError, match=words.replace("?", r"\?")):
            parse_target(url, policy)
    assert "does not fetch" in str(asyncio.run(_refused(f"https://localhost:{port}/cat.png", MediaURLPolicy())))


async def _refused(url: str, policy: MediaURLPolicy) -> MediaURLError:
    try:
        await fetch_image(url, policy)
    except MediaURLError as exc:
        return exc
    raise AssertionError("fetched")


def test_host_list_entries():
    policy = MediaURLPolicy(hosts=check_hosts(["Images.Example.com", "*.cdn.example.org", "media.example.net:8443"]))
    allowed = [("images.example.com", 443), ("a.cdn.example.org", 443), ("a.b.cdn.example.org", 443)]
    refused = [
        ("example.com", 443),
        ("images.example.com", 8443),
        ("cdn.example.org", 443),  # the wildcard is for subdomains
        ("evilcdn.example.org", 443),
        ("media.example.net", 443),
    ]
    assert all(policy.allows_host(h, p) for h, p in allowed)
    assert not any(policy.allows_host(h, p) for h, p in refused)
    assert policy.allows_host("media.example.net", 8443)
    for bad in ("bad host", "", "*.", "x.com:0", "a/b"):
        with pytest.raises(ValueError, match="not a host name"):
            check_hosts([bad])


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1",
     "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1"],
)  # fmt: skip
def test_addresses_that_are_not_public_are_refused(address):
    with pytest.raises(MediaURLError, match="not public"):
        check_address(address, MediaURLPolicy(hosts=("x.org",)))
    assert check_address(address, MediaURLPolicy(hosts=("x.org",), allow_private=True))


def test_public_addresses_pass():
    policy = MediaURLPolicy(hosts=("x.org",))
    assert check_address("93.184.216.34", policy) == "93.184.216.34"
    assert check_address("::ffff:93.184.216.34", policy) == "93.184.216.34"
    assert check_address("2606:4700:4700::1111", policy) == "2606:4700:4700::1111"


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
