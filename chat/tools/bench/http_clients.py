"""The sessions' clients of ``turncache bench http``: one level's conversations over HTTP (SSE) or the WebSocket.

By default they run in a process of their own (:func:`run_apart`; ``python -m chat.tools.bench.http_clients``), as a
real server's clients run on other machines: in the benchmark's process they would share its interpreter lock with the
server's event loop and the engine's thread, and every event they parse would hold the engine's Python back for that
long, a cost no deployment has (not one that two runs side by side could tell from the noise, though:
docs/benchmarks.md, 2026-11-26 afternoon). What they cost the machine (two cores shared with the engine and the server)
is their CPU time, which they report and the benchmark gives as ``client_cpu_share``. :func:`run_here` runs them in the
calling thread instead (``bench http --clients-in-process``), for comparison.

- ``http``: ``POST /v1/chat/completions`` with ``stream: true``, an ``aiohttp`` session reading the server-sent
  events line by line and parsing each ``data:`` line;
- ``ws``: ``completion.create`` on one WebSocket per session (the ``websockets`` client), every event parsed;
- ``http_chat`` and ``ws_chat`` (``turncache bench chat``): each conversation is a system message and its user
  messages, sent one turn after the other, each reply appended to the history: over HTTP every request is stateless
  and carries the whole history; over the WebSocket one session per conversation (``session.create``, then one
  ``turn.create`` per user message). A :class:`Served` then sums the conversation's turns.

All run on uvloop (where installed, as the server does) and parse JSON with orjson: a client as light as the
field's (vLLM's and SGLang's serving benchmarks use aiohttp for that reason), since on this benchmark's machine every
cycle a client spends is taken from the engine. httpx on asyncio's own loop took about twice the CPU per token
(0.10 of a core against 0.05 at 32 sessions, docs/benchmarks.md, 2026-11-26 evening).

A level's wall time runs from the first request sent to the last reply ended, on the clients' clock. The process
protocol: ``python -m chat.tools.bench.http_clients CONFIG_JSON`` (:class:`ClientConfig`) imports its clients, writes
``ready`` on a line, waits for a line on its standard input, runs the level, and writes one JSON object on a line:
``replies`` (each session's :class:`Served`, in order; an exception as its error), ``wall_s`` and ``cpu_s`` (its own
CPU time over the level).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import orjson

from chat.tools.bench.child_process import child_report, ready_child

TIMEOUT_S = 600.0  # the longest a client waits for the next bytes of a reply


@dataclass
class Served:
    """One session's reply as a client saw it."""

    tokens: int  # completion tokens, from the reply's usage
    ttft_ms: float | None  # request sent -> first content received (None: no content)
    error: str | None = None
    turn_ttfts_ms: list[float] = field(default_factory=list)  # chats: each turn's ttft_ms, in order
    later_prompt_tokens: int = 0  # chats: prompt tokens of the turns after the first, from their usage
    later_cached_tokens: int = 0  # chats: of those, the ones served from the prefix cache


@dataclass
class ClientConfig:
    transport: str  # "http" or "ws"; "http_chat" or "ws_chat": each conversation turn by turn
    url: str  # the server's base URL (http://host:port)
    conversations: list[list[dict]]  # one session each, all at once (chats: the system message, then the users')
    reply_tokens: int
    key: str | None = None  # bearer key (None: none sent)


def _chat_body(messages: list[dict], reply_tokens: int, stream: bool = True) -> dict:
    return {"messages": messages, "temperature": 0.0, "max_tokens": reply_tokens, "stream": stream}


async def http_session(session, url: str, messages: list[dict], reply_tokens: int) -> Served:
    """One streamed chat completion over ``session`` (an ``aiohttp.ClientSession``, with the headers it sends):
    every ``data:`` line parsed."""
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with session.post(url, json=_chat_body(messages, reply_tokens)) as response:
        if response.status != 200:
            return Served(0, None, f"HTTP {response.status}: {(await response.read())[:200]!r}")
        async for line in response.content:  # one line at a time, its end kept
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                return Served(tokens, ttft, str(chunk["error"]))
            if ttft is None and any(c["delta"].get("content") for c in chunk["choices"]):
                ttft = (time.perf_counter() - start) * 1000
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return Served(tokens, ttft)


async def ws_session(url: str, messages: list[dict], reply_tokens: int) -> Served:
    """One ``completion.create`` on a WebSocket of its own: every event parsed."""
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None) as ws:
        start = time.perf_counter()
        sampling = {"temperature": 0.0, "max_tokens": reply_tokens}
        await ws.send(json.dumps({"type": "completion.create", "messages": messages, "sampling": sampling}))
        ttft = None
        while True:
            event = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            if event["type"] == "reply.delta" and ttft is None:
                ttft = (time.perf_counter() - start) * 1000
            elif event["type"] == "error" and "turn_id" not in event:
                return Served(0, ttft, f"{event['code']}: {event['message']}")
            elif event["type"] == "reply.done":
                error = None if event["finish_reason"] in ("stop", "length") else event["finish_reason"]
                return Served(event["usage"]["completion_tokens"], ttft, error)


@dataclass
class _Reply:
    """One streamed turn of a chat as a client saw it."""

    text: str
    tokens: int
    ttft_ms: float | None
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None


async def _http_turn(session, url: str, messages: list[dict], reply_tokens: int) -> _Reply:
    start = time.perf_counter()
    ttft, pieces, usage = None, [], {}
    async with session.post(url, json=_chat_body(messages, reply_tokens)) as response:
        if response.status != 200:
            return _Reply("", 0, None, 0, 0, f"HTTP {response.status}: {(await response.read())[:200]!r}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                return _Reply("".join(pieces), 0, ttft, 0, 0, str(chunk["error"]))
            for choice in chunk["choices"]:
                content = choice["delta"].get("content")
                if content:
                    if ttft is None:
                        ttft = (time.perf_counter() - start) * 1000
                    pieces.append(content)
            if chunk.get("usage"):
                usage = chunk["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return _Reply("".join(pieces), usage.get("completion_tokens", 0), ttft, usage.get("prompt_tokens", 0), cached)


def _summed(replies: list[_Reply]) -> Served:
    """A conversation's turns as one :class:`Served` (its first turn's ttft as ``ttft_ms``)."""
    ttfts = [r.ttft_ms for r in replies if r.ttft_ms is not None]
    errors = [r.error for r in replies if r.error is not None]
    return Served(
        sum(r.tokens for r in replies),
        ttfts[0] if ttfts else None,
        errors[0] if errors else None,
        ttfts,
        sum(r.prompt_tokens for r in replies[1:]),
        sum(r.cached_tokens for r in replies[1:]),
    )


async def http_chat(session, url: str, conversation: list[dict], reply_tokens: int) -> Served:
    """A conversation (system message, then user messages) turn by turn, every request with the whole history."""
    history, replies = conversation[:1], []
    for user in conversation[1:]:
        history.append(user)
        reply = await _http_turn(session, url, history, reply_tokens)
        replies.append(reply)
        if reply.error is not None:
            break
        history.append({"role": "assistant", "content": reply.text})
    return _summed(replies)


async def ws_chat(url: str, conversation: list[dict], reply_tokens: int) -> Served:
    """A conversation in a session of its own: ``session.create`` with the system message, one ``turn.create`` per
    user message (the server keeps the history)."""
    from websockets.asyncio.client import connect

    replies = []
    async with connect(url, max_size=None) as ws:
        sampling = {"temperature": 0.0, "max_tokens": reply_tokens}
        await ws.send(
            json.dumps({"type": "session.create", "system": conversation[0]["content"], "sampling": sampling})
        )
        while True:
            event = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            if event["type"] == "session.created":
                break
            if event["type"] == "error":
                return Served(0, None, f"{event['code']}: {event['message']}")
        for user in conversation[1:]:
            start = time.perf_counter()
            await ws.send(json.dumps({"type": "turn.create", "content": user["content"]}))
            ttft = None
            while True:
                event = orjson.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
                kind = event["type"]
                if kind == "reply.delta" and ttft is None:
                    ttft = (time.perf_counter() - start) * 1000
                elif kind == "error" and "turn_id" not in event:
                    replies.append(_Reply("", 0, ttft, 0, 0, f"{event['code']}: {event['message']}"))
                    break
                elif kind == "reply.done":
                    usage = event["usage"]
                    error = None if event["finish_reason"] in ("stop", "length") else event["finish_reason"]
                    cached = usage["prompt_tokens_details"]["cached_tokens"]
                    replies.append(_Reply("", usage["completion_tokens"], ttft, usage["prompt_tokens"], cached, error))
                    break
            if replies[-1].error is not None:
                break
    return _summed(replies)


async def http_chat_level(cfg: ClientConfig) -> list[Served | BaseException]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=len(cfg.conversations), keepalive_timeout=1.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = cfg.url + "/v1/chat/completions"
        return await asyncio.gather(
            *(http_chat(session, url, c, cfg.reply_tokens) for c in cfg.conversations), return_exceptions=True
        )


async def ws_chat_level(cfg: ClientConfig) -> list[Served | BaseException]:
    url = cfg.url.replace("http://", "ws://") + "/v1/ws"
    return await asyncio.gather(*(ws_chat(url, c, cfg.reply_tokens) for c in cfg.conversations), return_exceptions=True)


async def http_level(cfg: ClientConfig) -> list[Served | BaseException]:
    import aiohttp

    n = len(cfg.conversations)
    # an idle pooled connection is given up after 1 s: the bad-clients phase's server closes idle ones after 2 s
    # (--idle-connection-s), and a client must not reuse a connection the server is closing
    connector = aiohttp.TCPConnector(limit=n, keepalive_timeout=1.0)
    headers = {"authorization": f"Bearer {cfg.key}"} if cfg.key else None
    timeout = aiohttp.ClientTimeout(total=None, sock_read=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
        url = cfg.url + "/v1/chat/completions"
        return await asyncio.gather(
            *(http_session(session, url, m, cfg.reply_tokens) for m in cfg.conversations), return_exceptions=True
        )


async def ws_level(cfg: ClientConfig) -> list[Served | BaseException]:
    url = cfg.url.replace("http://", "ws://") + "/v1/ws" + (f"?token={cfg.key}" if cfg.key else "")
    return await asyncio.gather(
        *(ws_session(url, m, cfg.reply_tokens) for m in cfg.conversations), return_exceptions=True
    )


LEVELS = {"http": http_level, "ws": ws_level, "http_chat": http_chat_level, "ws_chat": ws_chat_level}


def _import_client(transport: str) -> None:
    """The transport's client library, imported before the level is timed."""
    if transport.startswith("http"):
        import aiohttp  # noqa: F401
    else:
        import websockets.asyncio.client  # noqa: F401


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (as uvicorn picks it for the server), else asyncio's (None)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _run_level(cfg: ClientConfig) -> list[Served | BaseException]:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(LEVELS[cfg.transport](cfg))


def run_here(cfg: ClientConfig) -> tuple[list[Served | BaseException], float, float]:
    """The level in the calling thread: (each session's reply or exception, wall seconds, this thread's CPU
    seconds)."""
    _import_client(cfg.transport)
    cpu, start = time.thread_time(), time.perf_counter()
    replies = _run_level(cfg)
    return replies, time.perf_counter() - start, time.thread_time() - cpu


def run_apart(cfg: ClientConfig, timeout_s: float = TIMEOUT_S) -> tuple[list[Served | BaseException], float, float]:
    """The level in a process of its own (see the module docstring): (each session's reply, wall seconds, the
    process's CPU seconds over the level).

    Raises:
        RuntimeError: the process did not start its clients or did not report.
    """
    with ready_child("chat.tools.bench.http_clients", asdict(cfg), "the clients") as process:
        report = child_report(process, "go\n", timeout_s, "the clients")
    return [Served(**r) for r in report["replies"]], report["wall_s"], report["cpu_s"]


def main(argv: list[str]) -> int:
    cfg = ClientConfig(**json.loads(argv[0]))
    _import_client(cfg.transport)
    print("ready", flush=True)
    sys.stdin.readline()
    cpu, start = time.process_time(), time.perf_counter()
    replies = _run_level(cfg)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    out = [asdict(r) if isinstance(r, Served) else asdict(Served(0, None, repr(r))) for r in replies]
    print(json.dumps({"replies": out, "wall_s": wall, "cpu_s": cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
