"""Fetching an image named by an ``https://`` URL, for clients that pass URLs instead of data URLs (LangChain,
LlamaIndex). Off unless the operator lists the hosts it may fetch from (``--media-url-host``); the request path
that uses it is :mod:`chat.server.transport.media_urls`.

Rules, each refusal a :class:`MediaURLError` saying what was wrong:

- The URL: ``https`` only, no user name or password, at most :data:`MAX_URL_CHARS`; its host (lower-cased) is on
  the policy's list, as the exact name or under a ``*.example.com`` entry; a port other than 443 only where the
  entry names it (``example.com:8443``).
- Addresses: the name is resolved once and every address it resolves to must be public (``ipaddress``'s
  ``is_global``, not multicast; an IPv4-mapped IPv6 address is judged as the IPv4 one), unless the policy allows
  private addresses (an operator's own image host on its network). The connection goes to the address that was
  checked, with TLS verifying the certificate against the host name, so a second DNS answer cannot point the fetch
  elsewhere. No proxy from the environment is used.
- Redirects: followed to the same host and port only, at most :data:`MAX_REDIRECTS`, each checked again; a
  redirect to another host is refused.
- Size and time: a ``Content-Length`` over the policy's ``max_bytes`` is refused before the body is read, and a
  body is never read past ``max_bytes``; the whole fetch (resolving, connecting, redirects, body) ends within
  ``timeout_s``.
- The answer: status 200; a ``Content-Type`` that names a type must be ``image/*``; without one (or with
  ``application/octet-stream``) the bytes' signature must be an image format's.

What comes back is the bytes and their MIME type; the caller makes a data URL of them, so the item's identity is
its bytes' digest, as for any data URL: the same image by URL and inline is one media item to the cache.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import NamedTuple

import httpx

from modalities import formats

MiB = 1024 * 1024
MAX_URL_CHARS = 2048  # longer URLs are refused without a look-up
MAX_REDIRECTS = 3  # same-host redirects followed
UNTYPED = ("", "application/octet-stream", "binary/octet-stream")  # Content-Types that leave the bytes to decide
IMAGE_CONTAINERS = {"jpeg", "png", "webp", "avif", "gif", "bmp", "tiff", "heif"}  # modalities.formats.sniff names


class MediaURLError(ValueError):
    """A media URL this server will not fetch, or whose fetch failed; the message says which and why."""


@dataclass(frozen=True, slots=True)
class MediaURLPolicy:
    """What the server may fetch. With no hosts, nothing is fetched."""

    hosts: tuple[str, ...] = ()  # "example.com", "*.example.com" (its subdomains), "example.com:8443"
    max_bytes: int = 20 * MiB  # most bytes of one fetched image
    timeout_s: float = 10.0  # the whole fetch of one URL, redirects included
    allow_private: bool = False  # allow hosts that resolve to private, loopback or link-local addresses
    ca_file: str | None = None  # certificates to trust instead of the system's (an internal CA)

    @property
    def enabled(self) -> bool:
        return bool(self.hosts)

    def allows_host(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is on the list (``host`` lower-case, without brackets)."""
        for entry in self.hosts:
            name, port_text = _split_entry(entry.lower())
            wanted = int(port_text) if port_text else 443
            if port != wanted:
                continue
            if name == host or (name.startswith("*.") and host.endswith(name[1:]) and len(host) > len(name) - 1):
                return True
        return False


class Fetched(NamedTuple):
    data: bytes  # the image's bytes
    mime: str  # e.g. "image/png"


class Target(NamedTuple):
    host: str  # lower-case name (or address literal) from the URL
    port: int
    path: str  # path and query, at least "/"


def _split_entry(entry: str) -> tuple[str, str]:
    name, sep, port = entry.rpartition(":")
    return (name, port) if sep and port.isdigit() else (entry, "")


def check_hosts(hosts: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The list as a policy keeps it; refuses entries that are not a host name, ``*.name`` or ``name:port``.

    Raises:
        ValueError: naming the entry.
    """
    out = []
    for entry in hosts:
        name, port = _split_entry(entry.strip().lower())
        bare = name.removeprefix("*.")
        labels = bare.split(".")
        ok = bool(bare) and all(label and len(label) <= 63 for label in labels)
        ok = ok and all(c.isalnum() or c in "-." for c in bare) and (not port or 0 < int(port) < 65536)
        if not ok:
            raise ValueError(f"{entry!r} is not a host name, '*.name' or 'name:port'")
        out.append(entry.strip().lower())
    return tuple(out)


def parse_target(url: str, policy: MediaURLPolicy) -> Target:
    """Where ``url`` points, checked against the URL rules and the host list (no network).

    Raises:
        MediaURLError: a URL the rules refuse.
    """
    if len(url) > MAX_URL_CHARS:
        raise MediaURLError(f"the URL is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or 443
    except ValueError as exc:
        raise MediaURLError(f"the URL does not parse: {exc}") from None
    if parts.scheme.lower() != "https":
        raise MediaURLError("only https:// URLs are fetched")
    if parts.username is not None or parts.password is not None:
        raise MediaURLError("a URL with a user name or password is not fetched")
    host = (parts.hostname or "").lower()
    if not host:
        raise MediaURLError("the URL names no host")
    if not policy.allows_host(host, port):
        raise MediaURLError(f"{host}:{port} is not on this server's list of media hosts")
    path = parts.path or "/"
    return Target(host, port, path + ("?" + parts.query if parts.query else ""))


def check_address(address: str, policy: MediaURLPolicy) -> str:
    """``address`` (as ``getaddrinfo`` gives it) if the policy lets the server connect to it.

    Raises:
        MediaURLError: a private, loopback, link-local, reserved or multicast address (unless allowed).
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not policy.allow_private and (not ip.is_global or ip.is_multicast):
        raise MediaURLError("the host resolves to an address that is not public")
    return str(ip)


async def resolve(target: Target, policy: MediaURLPolicy) -> str:
    """One address of ``target.host``, after every address it resolves to passed :func:`check_address`.

    Raises:
        MediaURLError: the name does not resolve, or one of its addresses is refused.
    """
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError:
        raise MediaURLError(f"the host {target.host} does not resolve") from None
    addresses = [check_address(str(info[4][0]), policy) for info in infos]
    if not addresses:
        raise MediaURLError(f"the host {target.host} does not resolve")
    return addresses[0]


def _redirect(current: str, location: str | None, target: Target, policy: MediaURLPolicy) -> tuple[str, Target]:
    if not location:
        raise MediaURLError("the server answered a redirect without a Location")
    url = urllib.parse.urljoin(current, location)
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port or 443
    except ValueError:
        raise MediaURLError("the server redirected to a URL that does not parse") from None
    if (host, port) != (target.host, target.port):
        raise MediaURLError(f"the server redirected to another host ({host}:{port})")
    return url, parse_target(url, policy)


def _mime_of(content_type: str, data: bytes) -> str:
    declared = content_type.split(";", 1)[0].strip().lower()
    if declared.startswith("image/"):
        return declared
    if declared not in UNTYPED:
        raise MediaURLError(f"the server sent {declared!r}, not an image")
    container = formats.sniff(data)
    if container not in IMAGE_CONTAINERS:
        raise MediaURLError("the fetched bytes are not an image")
    return f"image/{container}"


async def _get(client: httpx.AsyncClient, address: str, target: Target, max_bytes: int) -> httpx.Response | Fetched:
    """One GET of ``target`` at ``address``: a redirect response (unread), or the body."""
    literal = f"[{address}]" if ":" in address else address
    host_header = target.host if target.port == 443 else f"{target.host}:{target.port}"
    request = client.build_request(
        "GET",
        f"https://{literal}:{target.port}{target.path}",
        headers={"Host": host_header, "Accept": "image/*"},
        extensions={"sni_hostname": target.host},
    )
    response = await client.send(request, stream=True)
    try:
        if response.is_redirect:
            return response
        if response.status_code != 200:
            raise MediaURLError(f"the server answered HTTP {response.status_code}")
        length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise MediaURLError(f"the image is over {max_bytes} bytes")
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > max_bytes:
                raise MediaURLError(f"the image is over {max_bytes} bytes")
        if not body:
            raise MediaURLError("the server sent no bytes")
        return Fetched(bytes(body), _mime_of(response.headers.get("content-type", ""), bytes(body)))
    finally:
        await response.aclose()


async def fetch_image(url: str, policy: MediaURLPolicy) -> Fetched:
    """The image ``url`` names, fetched under ``policy`` (see the module docstring for the rules).

    Raises:
        MediaURLError: the URL is refused, or the fetch failed, timed out or brought something else than an image.
    """
    if not policy.enabled:
        raise MediaURLError("this server does not fetch media by URL")
    target = parse_target(url, policy)
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=policy.ca_file) if policy.ca_file else True
    timeout = httpx.Timeout(policy.timeout_s)
    try:
        async with (
            asyncio.timeout(policy.timeout_s),
            httpx.AsyncClient(verify=verify, timeout=timeout, trust_env=False, follow_redirects=False) as client,
        ):
            for _ in range(MAX_REDIRECTS + 1):
                address = await resolve(target, policy)
                got = await _get(client, address, target, policy.max_bytes)
                if isinstance(got, Fetched):
                    return got
                url, target = _redirect(url, got.headers.get("location"), target, policy)
            raise MediaURLError(f"more than {MAX_REDIRECTS} redirects")
    except TimeoutError:
        raise MediaURLError(f"the fetch took longer than {policy.timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise MediaURLError(f"the fetch failed: {type(exc).__name__}") from None
