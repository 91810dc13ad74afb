"""Media by URL on the HTTP API: image parts that name an ``https://`` URL are fetched
(:mod:`chat.server.transport.url_fetch`) and replaced by data URLs before the request is validated, so everything
after (validation, hashing, the media store, the prefix cache) sees what a client that inlines its images sends: the
same image by URL and by data URL is one item, hashed from its bytes.

:class:`MediaURLMiddleware` is an ASGI middleware placed inside the authentication guard (a request without a
valid key makes the server fetch nothing). It looks at ``POST /v1/chat/completions`` (``messages[i].content[j]``
parts ``{"type": "image_url", "image_url": {"url": "https://..."}}``) and ``POST /v1/responses``
(``input[i].content[j]`` parts ``{"type": "input_image", "image_url": "https://..."}``) and ``POST /v1/messages``
(``messages[i].content[j]`` blocks ``{"type": "image", "source": {"type": "url", "url": "https://..."}}``, the
URL replaced by the data URL; an image inside a ``tool_result`` is not fetched); other routes, and bodies
with no ``://`` in them, pass untouched and unparsed. At most :data:`MAX_URLS_PER_REQUEST` distinct URLs are fetched
per request, all at once; one that fails refuses the whole request with ``invalid_media`` naming the part.

With the feature off (no hosts listed) the middleware is not installed, and a URL part is refused by validation
(``chat.protocol.content``) with a message that says the server does not fetch URLs.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.transport.url_fetch import Fetched, MediaURLError, MediaURLPolicy, fetch_image

MAX_URLS_PER_REQUEST = 16  # distinct URLs one request may ask the server to fetch
ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Fetch = Callable[[str, MediaURLPolicy], Awaitable[Fetched]]
Refuse = Callable[[BaseException], Callable[[Scope, Receive, Send], Awaitable[None]]]  # exception -> ASGI response


class URLSite:
    """One place in a request body that holds a media URL: ``holder[key]`` is the URL."""

    __slots__ = ("holder", "item", "key")

    def __init__(self, holder: dict[str, Any], key: str, item: str) -> None:
        self.holder = holder  # the dict that holds the URL
        self.key = key  # its key there
        self.item = item  # the part, as errors name it: "messages[1].content[0]"

    @property
    def url(self) -> str:
        return self.holder[self.key]


def _is_url(value: Any) -> bool:
    return isinstance(value, str) and value[:8].lower().startswith(("https://", "http://"))


def url_sites(route: str, body: Any) -> Iterator[URLSite]:
    """The image URLs of a request body of ``route`` (one of :data:`ROUTES`), in order."""
    if route == "/v1/messages":  # Anthropic's image blocks: {"type": "image", "source": {"type": "url", "url": ...}}
        yield from _anthropic_sites(body)
        return
    messages, kind = (body.get("messages"), "image_url") if route == ROUTES[0] else (body.get("input"), "input_image")
    where = "messages" if route == ROUTES[0] else "input"
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        parts = message.get("content") if isinstance(message, dict) else None
        if not isinstance(parts, list):
            continue
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != kind:
                continue
            holder = part.get("image_url") if kind == "image_url" else part
            key = "url" if kind == "image_url" else "image_url"
            if isinstance(holder, dict) and _is_url(holder.get(key)):
                yield URLSite(holder, key, f"{where}[{i}].content[{j}]")


def _anthropic_sites(body: Any) -> Iterator[URLSite]:
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        blocks = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(blocks if isinstance(blocks, list) else ()):
            source = block.get("source") if isinstance(block, dict) and block.get("type") == "image" else None
            if isinstance(source, dict) and source.get("type") == "url" and _is_url(source.get("url")):
                yield URLSite(source, "url", f"messages[{i}].content[{j}]")


def data_url(fetched: Fetched) -> str:
    return f"data:{fetched.mime};base64," + base64.b64encode(fetched.data).decode("ascii")


async def inline_urls(route: str, body: Any, policy: MediaURLPolicy, fetch: Fetch = fetch_image) -> bool:
    """Replace the image URLs of ``body`` by data URLs of what they name, fetched at once; False if it had none.

    Raises:
        MediaURLError: with ``.item`` set, for the first part (in order) whose URL could not be fetched; or for
            more than :data:`MAX_URLS_PER_REQUEST` distinct URLs.
    """
    sites = list(url_sites(route, body))
    if not sites:
        return False
    urls = list(dict.fromkeys(site.url for site in sites))
    if len(urls) > MAX_URLS_PER_REQUEST:
        error = MediaURLError(f"a request may name at most {MAX_URLS_PER_REQUEST} media URLs")
        error.item = sites[0].item  # type: ignore[attr-defined]
        raise error
    results = await asyncio.gather(*(fetch(url, policy) for url in urls), return_exceptions=True)
    by_url = dict(zip(urls, results, strict=True))
    for site in sites:
        got = by_url[site.url]
        if isinstance(got, MediaURLError):
            got.item = site.item  # type: ignore[attr-defined]
            raise got
        if isinstance(got, BaseException):
            raise got
    for site in sites:
        site.holder[site.key] = data_url(by_url[site.url])  # type: ignore[arg-type]
    return True


class MediaURLMiddleware:
    """ASGI middleware: image URLs in chat-completions, responses and messages bodies become data URLs (see the module
    docstring)."""

    def __init__(
        self, app: Any, policy: MediaURLPolicy, max_body: int, refuse: Refuse, fetch: Fetch = fetch_image
    ) -> None:
        self.app = app  # the wrapped ASGI app
        self.policy = policy  # what may be fetched
        self.max_body = max_body  # bytes of a request body read at most (the guard refused longer declared ones)
        self.refuse = refuse  # the server's error response for an exception (one format for every error)
        self.fetch = fetch  # fetch_image, or a stand-in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in ROUTES:
            return await self.app(scope, receive, send)
        raw, more = await _read_body(receive, self.max_body)
        if more or b"://" not in raw:
            return await self.app(scope, _replay(raw, receive, more), send)
        try:
            body = json.loads(raw)
        except ValueError:  # validation reports it
            return await self.app(scope, _replay(raw, receive, more), send)
        try:
            if not isinstance(body, dict) or not await inline_urls(path, body, self.policy, self.fetch):
                return await self.app(scope, _replay(raw, receive, more), send)
        except MediaURLError as exc:
            item = getattr(exc, "item", None)
            error = RequestError(ErrorCode.INVALID_MEDIA, f"{item}: {exc}" if item else str(exc), param=item)
            return await self.refuse(error)(scope, receive, send)
        raw = json.dumps(body, ensure_ascii=False).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(raw)).encode())]}
        return await self.app(scope, _replay(raw, receive, False), send)


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body, up to ``limit`` bytes; True when more is left unread (the app then sees it all)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False
        if size > limit:
            return b"".join(chunks), True


def _replay(raw: bytes, receive: Receive, more: bool) -> Receive:
    """A ``receive`` that gives ``raw`` first, then (when ``more``) the rest of the original stream."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": more}
        return await receive()

    return replay
