"""Bad clients for ``turncache bench http``, in a process of their own (so that they cost the server's process no
event-loop time and no GIL; what they cost the machine is their own CPU time, which they report).

Three kinds, all on plain sockets (no HTTP library, so that their own cost stays small):

- **slow readers** (``slow_readers``): each sends a streaming chat completion whose chunks are large (log-
  probabilities with 20 alternatives, ``slow_max_tokens`` tokens), with a small receive buffer, then reads nothing
  for ``pause_s`` seconds (not a byte: the data stays in the kernel's buffers), then reads what is left to the end
  of the connection. What it got: ``slow_client`` (the server's typed error in the stream), ``cut`` (the connection
  closed before the stream's end: a write that waited past the send timeout), ``completed`` (the whole reply),
  ``refused`` (an HTTP error status); ``unfinished``: told to stop, it was still reading a reply
  ``STOP_GRACE_S`` later (the server neither cut it nor ended it). Then it starts again, until told to stop.
- **silent connections** (``silent``): each opens a TCP connection and sends nothing; when the server closes it
  (``closed``) another opens at once. Left open when told to stop: ``open_at_stop``; ``longest_open_s``: the longest
  any stayed open before the server closed it.
- **a flood** (``flood_rps`` requests a second over ``flood_connections`` keep-alive connections): tiny chat
  completions (one word, ``max_tokens`` 1, not streamed); counted by answer: ``ok`` (200), ``rate_limited`` (429),
  ``other`` (any other status, or a connection lost).

Run as ``python -m chat.tools.bench.bad_clients CONFIG_JSON`` (:class:`BadConfig` as JSON). It writes ``ready``
on a line of its standard output once every bad client is in its bad state (each slow reader's reply has started,
each silent connection is open, the flood has had its first answer), waits for a line on its standard input, stops
(a slow reader finishes the cycle it is in: its pause, then reading for ``STOP_GRACE_S`` at most), and writes one
JSON object on a line: the counts above and ``cpu_s`` (its own user + system CPU time, start-up included) and
``wall_s``.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import time
from dataclasses import asdict, dataclass, field

RCVBUF = 4096  # a slow reader's receive buffer, bytes (the kernel doubles it)
STOP_GRACE_S = 5.0  # once told to stop, a slow reader past its pause reads on this long at most


@dataclass
class BadConfig:
    host: str
    port: int
    slow_key: str  # the slow readers' bearer key
    flood_key: str  # the flood's bearer key
    slow_readers: int = 2  # concurrent slow readers
    pause_s: float = 5.0  # how long a slow reader reads nothing after sending its request
    slow_max_tokens: int = 256  # the slow readers' reply length
    silent: int = 16  # silent connections kept open
    flood_rps: float = 100.0  # flood requests a second, in all
    flood_connections: int = 4  # keep-alive connections the flood uses


@dataclass
class Outcomes:
    slow_reader: dict[str, int] = field(
        default_factory=lambda: {"slow_client": 0, "cut": 0, "completed": 0, "refused": 0, "unfinished": 0}
    )
    silent: dict[str, float] = field(default_factory=lambda: {"closed": 0, "open_at_stop": 0, "longest_open_s": 0.0})
    flood: dict[str, int] = field(default_factory=lambda: {"requests": 0, "ok": 0, "rate_limited": 0, "other": 0})


def chat_request(cfg: BadConfig, key: str, body: dict, *, close: bool) -> bytes:
    """One ``POST /v1/chat/completions`` as bytes."""
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {cfg.host}:{cfg.port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + data


def classify_stream(raw: bytes) -> str:
    """What a slow reader got, from everything it read (status line to the connection's end)."""
    status = raw.split(b" ", 2)[1] if raw.startswith(b"HTTP/1.1 ") else b""
    if status != b"200":
        return "refused" if status else "cut"
    if b'"code":"slow_client"' in raw:
        return "slow_client"
    return "completed" if b"data: [DONE]" in raw else "cut"


async def _connect(cfg: BadConfig, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting: the window offered to the server is set at the handshake
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (cfg.host, cfg.port))
    return sock


async def _readable(sock: socket.socket) -> None:
    """Wait until ``sock`` has data (or its end), reading none of it."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _read_to_end(sock: socket.socket) -> bytes:
    loop, chunks = asyncio.get_running_loop(), []
    while True:
        try:
            data = await loop.sock_recv(sock, 65536)
        except ConnectionError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


async def _read_until_end_or(sock: socket.socket, stop: asyncio.Event, grace_s: float) -> bytes | None:
    """Everything ``sock`` sends until its end; None if ``stop`` was set more than ``grace_s`` seconds before that
    end came (the bytes read are then dropped)."""
    reading = asyncio.ensure_future(_read_to_end(sock))

    async def deadline() -> None:
        await stop.wait()
        await asyncio.sleep(grace_s)

    late = asyncio.ensure_future(deadline())
    try:
        await asyncio.wait((reading, late), return_when=asyncio.FIRST_COMPLETED)
        return reading.result() if reading.done() else None
    finally:
        for task in (reading, late):
            task.cancel()
        await asyncio.gather(reading, late, return_exceptions=True)


async def slow_reader(cfg: BadConfig, out: Outcomes, started: asyncio.Event, stop: asyncio.Event) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse and the sea."}],
        "max_tokens": cfg.slow_max_tokens,
        "temperature": 0.0,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 20,
    }
    request = chat_request(cfg, cfg.slow_key, body, close=True)
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        sock = await _connect(cfg, RCVBUF)
        try:
            await loop.sock_sendall(sock, request)
            sent = time.monotonic()
            await _readable(sock)  # the server answered: its reply is being generated
            started.set()
            await asyncio.sleep(max(0.0, cfg.pause_s - (time.monotonic() - sent)))  # reads nothing
            raw = await _read_until_end_or(sock, stop, STOP_GRACE_S)
            got = "unfinished" if raw is None else classify_stream(raw)
        except ConnectionError:
            got = "cut"
        finally:
            sock.close()
        out.slow_reader[got] += 1


async def silent_connection(cfg: BadConfig, out: Outcomes, started: asyncio.Event, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        sock = await _connect(cfg)
        opened = time.monotonic()
        started.set()
        closed = asyncio.ensure_future(loop.sock_recv(sock, 1))  # b"": the server closed it
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((closed, stopping), return_when=asyncio.FIRST_COMPLETED)
            if closed.done():
                out.silent["closed"] += 1
                out.silent["longest_open_s"] = max(out.silent["longest_open_s"], time.monotonic() - opened)
            else:
                out.silent["open_at_stop"] += 1
        finally:
            for task in (closed, stopping):
                task.cancel()
            await asyncio.gather(closed, stopping, return_exceptions=True)
            sock.close()


async def _read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, bool]:
    """One HTTP response from a keep-alive connection; (status, whether the connection can be used again)."""
    loop = asyncio.get_running_loop()
    while b"\r\n\r\n" not in buffer:
        data = await loop.sock_recv(sock, 65536)
        if not data:
            raise ConnectionError("closed before a response")
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
    headers = {k.strip().lower(): v.strip().lower() for k, v in headers.items()}
    if b"content-length" not in headers:  # not expected of these answers: read to the end, do not reuse
        await _read_to_end(sock)
        return status, False
    length = int(headers[b"content-length"])
    while len(rest) < length:
        data = await loop.sock_recv(sock, 65536)
        if not data:
            raise ConnectionError("closed inside a response")
        rest += data
    buffer[:] = rest[length:]
    return status, headers.get(b"connection") != b"close"


async def flood(
    cfg: BadConfig, index: int, out: Outcomes, started: asyncio.Event, stop: asyncio.Event, start: float
) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0.0}
    request = chat_request(cfg, cfg.flood_key, body, close=False)
    interval = cfg.flood_connections / cfg.flood_rps  # this connection's share of the rate
    sent = 0
    sock: socket.socket | None = None
    buffer = bytearray()
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            due = start + (index / cfg.flood_connections + sent) * interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent += 1
            out.flood["requests"] += 1
            try:
                if sock is None:
                    sock, buffer = await _connect(cfg), bytearray()
                await loop.sock_sendall(sock, request)
                status, reusable = await _read_response(sock, buffer)
            except (ConnectionError, ValueError, IndexError):
                out.flood["other"] += 1
                if sock is not None:
                    sock.close()
                sock = None
                continue
            out.flood["ok" if status == 200 else "rate_limited" if status == 429 else "other"] += 1
            started.set()
            if not reusable:
                sock.close()
                sock = None
    finally:
        if sock is not None:
            sock.close()


async def run(cfg: BadConfig, stop_requested) -> Outcomes:
    """Every bad client until ``await stop_requested()`` returns; writes ``ready`` once they are all in their bad
    state."""
    out, stop = Outcomes(), asyncio.Event()
    kinds = (
        [(slow_reader, ()) for _ in range(cfg.slow_readers)]
        + [(silent_connection, ()) for _ in range(cfg.silent)]
        + [(flood, (i,)) for i in range(cfg.flood_connections if cfg.flood_rps > 0 else 0)]
    )
    started = [asyncio.Event() for _ in kinds]
    start = time.monotonic()
    tasks = []
    for (fn, args), flag in zip(kinds, started, strict=True):
        extra = (start,) if fn is flood else ()
        tasks.append(asyncio.ensure_future(fn(cfg, *args, out, flag, stop, *extra)))
    all_started = asyncio.ensure_future(asyncio.gather(*(flag.wait() for flag in started)))
    await asyncio.wait([all_started, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:  # one that ended already failed (they run until told to stop): say why, stop
        if task.done():
            all_started.cancel()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            task.result()
    print("ready", flush=True)
    await stop_requested()
    stop.set()
    await asyncio.gather(*tasks)
    return out


def main(argv: list[str]) -> int:
    cfg = BadConfig(**json.loads(argv[0]))
    began = time.perf_counter()

    async def stop_requested() -> None:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    out = asyncio.run(run(cfg, stop_requested))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {**asdict(out), "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.perf_counter() - began}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
