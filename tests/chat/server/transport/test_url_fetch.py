"""Media by URL (``chat/server/transport/url_fetch.py``): the fetch rules against a local HTTPS server in the test
process (types, sizes, redirects, timeouts, certificates), the URL and host-list checks before any lookup, and the
addresses refused as not public. (Inlining fetched images into requests: test_media_urls.py.)"""

from __future__ import annotations

import asyncio

import pytest

from chat.server.transport.url_fetch import (
    MediaURLError,
    MediaURLPolicy,
    check_address,
    check_hosts,
    fetch_image,
    parse_target,
)
from tests.chat.server.transport.conftest import LIMIT, PNG, Images, fetch, policy_for, refusal


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
