import asyncio
import socket
import threading
import time

import pytest

from chat.engine.events import Delta, Done, Timings, Usage
from chat.protocol.errors import ErrorCode
from chat.server.errors import TRANSPORT, SlowClientError, code_of
from chat.server.reply.choices import run_turn_batches
from chat.server.surfaces.ws import ChatSocket
from chat.server.transport.backpressure import Pacer, TimedStreamingResponse, closing_idle


class _Flood:
    """An engine whose turn delivers one delta, then (once the test says the stream has taken it) ``n`` more at
    once, and records being cancelled."""

    def __init__(self, n: int) -> None:
        self.n, self.cancelled, self.started = n, threading.Event(), threading.Event()
        self.paused = threading.Event()  # pause() was called (this engine does not pause: a cluster's replica)

    def submit(self, request, sink):
        def deliver() -> None:
            sink(Delta("x", (1,)))
            self.started.wait(10)  # the flood comes only after the stream has taken its first delta
            for _ in range(self.n):
                sink(Delta("x", (1,)))

        threading.Thread(target=deliver).start()
        return self

    def cancel(self) -> None:
        self.cancelled.set()

    def pause(self) -> None:
        self.paused.set()

    def resume(self) -> None:
        pass


def test_a_stream_whose_client_leaves_too_much_unread_cancels_its_turns_with_slow_client():
    engine = _Flood(50)

    async def consume():
        batches = run_turn_batches(engine, [object()], max_pending=10)
        try:
            seen = await anext(batches)  # the turn starts
            engine.started.set()
            await asyncio.sleep(0.3)  # the consumer is stuck writing to its client
            first = len(seen)
            with pytest.raises(SlowClientError):
                while True:
                    seen += await anext(batches)
            return first, seen
        finally:
            await batches.aclose()

    first, seen = asyncio.run(consume())
    assert first == 1 and engine.cancelled.is_set() and len(seen) == first + 10  # the buffer's events, the error
    assert engine.paused.is_set()  # asked to pause first, at half the buffer; it did not, so the bound cut it
    assert code_of(SlowClientError("x")) is ErrorCode.SLOW_CLIENT
    assert TRANSPORT[ErrorCode.SLOW_CLIENT].ws_close == 1013


def test_a_write_the_client_does_not_take_in_time_ends_the_stream_and_closes_its_events():
    closed = asyncio.Event()

    async def body():
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            closed.set()

    async def never_taken(message) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()

    async def receive():
        await asyncio.Event().wait()

    async def run() -> float:
        response = TimedStreamingResponse(body(), media_type="text/event-stream", send_timeout_s=0.1)
        start = time.perf_counter()
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        await asyncio.wait_for(response(scope, receive, never_taken), 5)
        assert closed.is_set()
        return time.perf_counter() - start

    assert asyncio.run(run()) < 2


class _StuckSocket:
    """A WebSocket whose client reads nothing: every send waits forever."""

    def __init__(self) -> None:
        self.closed_with = None

    async def send_text(self, frame: str) -> None:
        await asyncio.Event().wait()

    async def close(self, code: int, reason: str = "") -> None:
        self.closed_with = code
        await asyncio.Event().wait()


class _Job:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _socket(ws, *, max_pending=None, send_timeout_s=0.1) -> ChatSocket:
    sock = ChatSocket.__new__(ChatSocket)  # the parts the writer uses, without an engine or a store
    sock.ws, sock.open, sock.too_slow, sock.reader = ws, True, False, None
    sock.outbox, sock.jobs = asyncio.Queue(), {"t1": _Job()}
    sock.pacer = Pacer(sock.jobs.values, max_pending) if max_pending is not None else None
    sock.max_pending, sock.send_timeout_s = max_pending, send_timeout_s
    return sock


def test_a_websocket_frame_the_client_does_not_take_in_time_cancels_the_turns_and_ends_the_socket():
    async def run():
        sock = _socket(_StuckSocket())
        sock.reader = asyncio.create_task(asyncio.Event().wait())  # stands for the reading loop
        sock.outbox.put_nowait("frame")
        await asyncio.wait_for(sock._write(), 5)
        await asyncio.sleep(0)
        return sock

    sock = asyncio.run(run())
    assert sock.too_slow and not sock.open and sock.jobs["t1"].cancelled and sock.reader.cancelled()


def test_a_websocket_whose_outbox_passes_its_bound_is_dropped_at_once():
    async def run():
        sock = _socket(_StuckSocket(), max_pending=3, send_timeout_s=60)
        sock.reader = asyncio.create_task(asyncio.Event().wait())
        for i in range(4):
            sock.outbox.put_nowait(f"frame {i}")
            if sock.outbox.qsize() > sock.max_pending:
                sock._drop_slow_client("test")
        await asyncio.sleep(0)
        return sock

    sock = asyncio.run(run())
    assert sock.too_slow and sock.jobs["t1"].cancelled and sock.reader.cancelled()
    assert sock.outbox.get_nowait() == 1013  # what was unread is dropped; the close is what is left to send


def test_a_connection_that_never_sends_is_closed_after_the_idle_time_and_one_that_sends_is_not():
    closed = []

    class Base(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            pass

        def connection_lost(self, exc) -> None:
            closed.append(self)

    async def run():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(closing_idle(Base, 0.2), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        silent, talking = socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port))
        talking.sendall(b"GET / HTTP/1.1\r\n")
        await asyncio.sleep(0.6)
        silent.setblocking(False)
        got = await loop.sock_recv(silent, 1)  # the server closed it: end of stream
        server.close()
        talking.close()
        silent.close()
        return got

    assert asyncio.run(run()) == b"" and len(closed) >= 1


def test_each_connections_kernel_send_buffer_is_the_one_set_and_the_setting_is_checked():
    import pydantic

    from chat.server.settings import ServerSettings
    from chat.server.transport.backpressure import send_buffer_bytes

    buffers = []

    class Base(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            buffers.append(transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))

    async def run(size):
        loop = asyncio.get_running_loop()
        server = await loop.create_server(closing_idle(Base, 5, size), "127.0.0.1", 0)
        client = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
        while len(buffers) < (1 if size else 2):
            await asyncio.sleep(0.01)
        client.close()
        server.close()

    asyncio.run(run(send_buffer_bytes(16)))
    asyncio.run(run(None))
    assert buffers[0] == 2 * 16 * 1024  # the kernel doubles what is set
    assert buffers[1] != buffers[0]  # not set: the kernel's own
    with pytest.raises(pydantic.ValidationError, match="send_buffer_kib"):
        ServerSettings(send_buffer_kib=1)


def test_a_kept_alive_connection_closes_after_the_idle_time_not_uvicorns_own_5_s():
    """uvicorn closes a kept-alive connection 5 s after a response, the very moment httpx's pool (the openai SDK's
    too) lets a client reuse it: a request sent into that race fails with a read error. The server's keep-alive
    timeout is ``idle_connection_s`` (30 s by default, longer than the clients'); here 0.3 s, so the close comes long
    before uvicorn's 5 s would."""
    from types import SimpleNamespace

    from fastapi import FastAPI

    from chat.server.runner import BackgroundServer

    app = FastAPI()
    app.state.settings = SimpleNamespace(idle_connection_s=0.3, send_buffer_kib=None)

    @app.get("/ping")
    def ping() -> dict:
        return {"ok": True}

    with BackgroundServer(app) as server:
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=3)
        conn.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        reply = b""
        while b'{"ok":true}' not in reply:
            reply += conn.recv(4096)
        start = time.monotonic()
        assert conn.recv(1) == b""  # the server closed it (a timeout here raises: still open after 3 s)
        waited = time.monotonic() - start
        conn.close()
    assert reply.startswith(b"HTTP/1.1 200") and waited < 3


class _ReadingSocket:
    """A WebSocket whose client reads every frame at once."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_text(self, frame: str) -> None:
        self.sent.append(frame)
        await asyncio.sleep(0)


def test_a_websocket_writer_sends_every_frame_in_order_and_leaves_no_timer_behind():
    async def run():
        sock = _socket(_ReadingSocket(), send_timeout_s=30)
        for i in range(50):
            sock.outbox.put_nowait(f"frame {i}")
        sock.outbox.put_nowait(None)
        await sock._write()
        pending = [h for h in asyncio.get_running_loop()._scheduled if not h.cancelled()]  # timers still set
        return sock, pending

    sock, pending = asyncio.run(run())
    assert sock.ws.sent == [f"frame {i}" for i in range(50)] and not sock.too_slow and sock.open
    assert pending == []  # one watchdog for the writer, cancelled when it ends (not one timer per frame)


class _Pacer:
    """An engine whose turn delivers ``n`` deltas, as fast as it can while it is not paused, and records how many it
    delivered while the stream's consumer was stuck."""

    def __init__(self, n: int) -> None:
        self.n, self.go, self.done = n, threading.Event(), threading.Event()
        self.go.set()
        self.pauses = self.resumes = 0

    def submit(self, request, sink):
        def deliver() -> None:
            for _ in range(self.n):
                assert self.go.wait(10)
                sink(Delta("x", (1,)))
                time.sleep(0.004)  # a fast engine step (a real one: 10+ ms); a pause acts after the loop reads it
            sink(Done("x" * self.n, (1,) * self.n, "length", Usage(1, 0, self.n), Timings(1.0, 1.0, 1.0, 1.0)))
            self.done.set()

        threading.Thread(target=deliver).start()
        return self

    def cancel(self) -> None:
        self.go.set()

    def pause(self) -> None:
        self.pauses += 1
        self.go.clear()

    def resume(self) -> None:
        self.resumes += 1
        self.go.set()


def test_a_stream_whose_client_falls_behind_pauses_its_turns_and_gets_the_whole_reply_at_its_pace():
    from chat.server.transport.backpressure import pause_threshold

    engine = _Pacer(200)

    async def consume():
        batches = run_turn_batches(engine, [object()], max_pending=64)
        seen, stalls = [], []
        async for batch in batches:
            seen += batch
            if len(seen) < 150:
                await asyncio.sleep(0.05)  # a write the client takes slowly: the turn runs ahead, then pauses
                stalls.append(len(batch))
        return seen, stalls

    seen, stalls = asyncio.run(asyncio.wait_for(consume(), 30))  # a turn never let go on would hang here
    assert len(seen) == 201 and isinstance(seen[-1][1], Done)  # nothing lost, no error
    assert engine.done.wait(10)  # its thread sets `done` after the Done it sent: under load, after the consumer ended
    assert engine.pauses >= 3 and engine.resumes >= engine.pauses
    assert max(stalls) <= pause_threshold(1, 64) + 1  # never more unread than the threshold (and one in flight)


def _stalled_stream(port: int, path: str, body: dict, stall_s: float) -> bytes:
    """A client that sends a streaming request, reads nothing for ``stall_s`` (a small receive buffer: the server's
    writes soon wait), then reads to the end."""
    import json

    data = json.dumps(body).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", port))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)
    time.sleep(stall_s)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


@pytest.mark.parametrize(
    "path,body,end",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go"}], "logprobs": True,
                                  "top_logprobs": 20}, b"data: [DONE]"),
        ("/v1/completions", {"prompt": "go", "logprobs": 5}, b"data: [DONE]"),
        ("/v1/responses", {"input": "go"}, b"response.completed"),
    ],
)  # fmt: skip
def test_a_client_that_stops_reading_a_while_pauses_its_turn_and_then_gets_the_whole_reply(path, body, end):
    """With a 16-event buffer, a client that reads nothing for 1.5 s would get ``slow_client`` (the engine makes a
    token every 2 ms); its turn pauses instead once its socket is full, so it gets everything once it reads."""
    from tests.chat.engine.fakes import FakeRuntime
    from tests.chat.server.conftest import make_server

    runtime = FakeRuntime(script=lambda prompt: "abcdefgh" * 60, delay_s=0.002)
    engine, srv = make_server(runtime=runtime, stream_buffer_events=16, send_timeout_s=10, send_buffer_kib=4)
    with srv:
        length = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
        raw = _stalled_stream(srv.port, path, {**body, "stream": True, length: 400}, 1.5)
    engine.close()
    assert raw.startswith(b"HTTP/1.1 200") and b"slow_client" not in raw and end in raw
    assert engine.metrics.finish_reasons == {"length": 1}  # the whole reply: 400 tokens, not cut
    assert engine.metrics.turn_pauses >= 1


def test_a_websocket_whose_client_falls_behind_pauses_its_turns_and_its_writer_lets_them_go_on():
    from chat.server.transport.backpressure import pause_threshold

    class Job:
        def __init__(self) -> None:
            self.paused = False

        def pause(self) -> None:
            self.paused = True

        def resume(self) -> None:
            self.paused = False

    async def run():
        sock = _socket(_ReadingSocket(), max_pending=64, send_timeout_s=30)
        sock.jobs.clear()
        sock.jobs.update(t1=Job(), t2=Job())
        at = pause_threshold(2, 64)
        for i in range(at - 1):
            sock.outbox.put_nowait(f"frame {i}")
        sock._send([])
        assert not sock.pacer.paused
        sock.outbox.put_nowait("one more")
        sock._send([])  # the threshold is reached: both turns pause
        paused_then = sock.pacer.paused and all(j.paused for j in sock.jobs.values())
        sock.outbox.put_nowait(None)
        await sock._write()  # the client reads: below half the threshold, they go on
        return paused_then, sock

    paused_then, sock = asyncio.run(run())
    assert paused_then and not sock.pacer.paused and not any(j.paused for j in sock.jobs.values())
    assert len(sock.ws.sent) == pause_threshold(2, 64)


def test_a_websocket_client_that_stops_reading_a_while_pauses_its_turn_and_then_gets_the_whole_reply():
    """As over HTTP: with a 16-frame bound, a socket whose client reads nothing for 1.5 s would be dropped with 1013
    (the engine makes a token every 2 ms); its turn pauses instead once the client's buffers are full."""
    import json

    from websockets.asyncio.client import connect

    from tests.chat.engine.fakes import FakeRuntime
    from tests.chat.server.conftest import make_server

    runtime = FakeRuntime(script=lambda prompt: "abcdefgh" * 60, delay_s=0.002)
    engine, srv = make_server(runtime=runtime, stream_buffer_events=16, send_timeout_s=10, send_buffer_kib=4)

    async def scenario() -> list[dict]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
        sock.connect(("127.0.0.1", srv.port))
        sock.setblocking(False)
        url = srv.url.replace("http://", "ws://") + "/v1/ws"
        # the library stops reading once 1 frame waits; no compression (these frames would shrink tenfold)
        async with connect(url, sock=sock, max_queue=1, compression=None) as ws:
            sampling = {"max_tokens": 400, "logprobs": True, "top_logprobs": 20}
            messages = [{"role": "user", "content": "go"}]
            await ws.send(json.dumps({"type": "completion.create", "messages": messages, "sampling": sampling}))
            await asyncio.sleep(1.5)  # reads nothing
            events = []
            while not events or events[-1]["type"] not in ("reply.done", "error"):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
            return events

    with srv:
        events = asyncio.run(scenario())
    engine.close()
    assert events[-1]["type"] == "reply.done" and events[-1]["finish_reason"] == "length", events[-1]
    assert sum(e["type"] == "reply.delta" for e in events) == 400 and engine.metrics.turn_pauses >= 1


@pytest.mark.parametrize("api", ["completions", "responses"])
def test_a_completions_or_responses_stream_past_its_bound_ends_with_a_typed_slow_client_error(api):
    """Events that keep coming after the pause (an engine that does not stop at once) end the stream with
    ``slow_client``, as chat completions' streams do."""
    from chat.server.surfaces import completions_api, responses_api

    engine = _Flood(50)
    engine.runtime = None

    async def consume() -> str:
        if api == "completions":
            req = completions_api.CompletionRequest(prompt="go", stream=True)
            chunks = await completions_api.stream(engine, req, [object()], "m", max_pending=10)
        else:
            req = responses_api.ResponsesRequest(input="go", stream=True)
            args = (engine, object(), req, "m", None, None, None, "tenant", None)
            chunks = await responses_api.stream(*args, max_pending=10)
        out = [await anext(chunks)]
        engine.started.set()
        await asyncio.sleep(0.3)  # the writer is stuck: the flood fills the buffer
        out += [chunk async for chunk in chunks]
        return "".join(out)

    text = asyncio.run(asyncio.wait_for(consume(), 10))
    assert engine.cancelled.is_set() and engine.paused.is_set() and '"code": "slow_client"' in text
