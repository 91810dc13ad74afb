"""What a client that reads too slowly costs: a bounded buffer and a bounded wait, never the engine's time.

The engine never waits for a client: its events for a connection wait in that connection's buffer (the HTTP stream's
queue, ``chat.server.reply.choices.run_turn_batches``; the WebSocket's outbox, ``chat.server.surfaces.ws``). A client
that reads slowly or not at all fills its socket, then its buffer:

- :func:`pause_threshold` events unread (8 a turn, at most half of ``stream_buffer_events``): its turns are paused
  in the engine (``JobHandle.pause``: they take no place in its steps and compute nothing, see the scheduler's
  *Paused turns*) until the connection's writer has sent what waited (half the threshold or less left unread), then
  they go on (:class:`Pacer`, one per HTTP stream or WebSocket). So a slow reader's reply runs at the pace it
  reads, and one that reads nothing costs the engine a socket's worth of tokens, not a buffer's or a timeout's;
- more than ``stream_buffer_events`` events unread all the same (events already on their way when the pause came: a
  cluster's turns pause a round trip away, in their replica's engine): its turns are cancelled at once with
  ``slow_client`` (``chat/server/errors.py``), sent after what is buffered;
- one write that waits longer than ``send_timeout_s`` for the client to read: the connection is closed (a WebSocket
  with 1013) and its turns cancelled (paused or not).

Connections that open and never send a request are closed by :func:`closing_idle` after ``idle_connection_s``.

What a connection whose client reads nothing holds, at most: its stream's unread events (``stream_buffer_events``),
the transport's write buffer (asyncio's 64 KiB high-water mark: a write waits beyond it, for ``send_timeout_s`` at
most) and the kernel's send buffer. Linux grows the last by itself up to ``net.ipv4.tcp_wmem``'s maximum (4 MiB
here: 3 MB of a stream were taken on loopback before a write waited); ``send_buffer_kib`` fixes it per connection
(``SO_SNDBUF``, which the kernel doubles), so that a client that stops reading costs that much of kernel memory and
its writes start waiting (then its turns end) after that many bytes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Collection

from fastapi.responses import StreamingResponse

from chat.server.errors import SlowClientError

log = logging.getLogger("turncache.backpressure")
PAUSE_EVENTS_PER_TURN = 8  # unread events a turn of a connection may have before its turns pause


def pause_threshold(turns: int, max_pending: int) -> int:
    """Unread events of a connection at which its turns pause: :data:`PAUSE_EVENTS_PER_TURN` for each of its
    ``turns`` (a loop that falls a few steps behind under load pauses nobody: its events are taken at its next
    turn), and at most half of ``max_pending`` (so that turns pause well before the buffer overflows)."""
    return max(1, min(PAUSE_EVENTS_PER_TURN * max(turns, 1), max_pending // 2))


class Pacer:
    """Pauses one connection's turns while its client has :func:`pause_threshold` events or more unread, and lets
    them go on once it is down to half of that. ``handles()``: the connection's running turns (each with ``pause``
    and ``resume``), asked at each change. On the event loop."""

    def __init__(self, handles: Callable[[], Collection], max_pending: int) -> None:
        self.handles = handles  # the connection's running turns
        self.max_pending = max_pending  # the connection's bound (stream_buffer_events)
        self.paused = False  # its turns are paused

    def unread(self, events: int) -> None:
        """The client now has ``events`` unread (one more arrived, or the writer took some)."""
        at = pause_threshold(len(self.handles()), self.max_pending)
        if not self.paused and events >= at:
            self.paused = True
            for handle in self.handles():
                handle.pause()
        elif self.paused and events <= at // 2:
            self.paused = False
            for handle in self.handles():
                handle.resume()


class TimedStreamingResponse(StreamingResponse):
    """A streaming response whose every write must be taken by the client within ``send_timeout_s``; else the
    stream ends (its body iterator closed, which cancels its turns) and the connection is closed.

    One timer per response watches the write in progress (``asyncio.timeout`` around each write made and cancelled a
    timer per write: per token and stream)."""

    def __init__(self, content, *, send_timeout_s: float, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.send_timeout_s = send_timeout_s  # the longest one write may wait for the client

    async def __call__(self, scope, receive, send) -> None:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        limit = self.send_timeout_s
        since: float | None = None  # when the write in progress began (None: none is)
        timed_out = False

        def watch() -> None:  # on the loop: cancel the response's task inside a write that waited too long
            nonlocal timed_out, timer
            if since is not None and loop.time() - since >= limit:
                timed_out = True
                task.cancel()
                return
            timer = loop.call_later(limit if since is None else since + limit - loop.time(), watch)

        async def timed_send(message) -> None:
            nonlocal since
            since = loop.time()
            try:
                await send(message)
            except asyncio.CancelledError:
                if not timed_out:
                    raise
                task.uncancel()
                raise SlowClientError(f"a write waited more than {limit} s for the client") from None
            finally:
                since = None

        timer = loop.call_later(limit, watch)
        try:
            await super().__call__(scope, receive, timed_send)
        except SlowClientError as exc:  # the response is cut short: the server closes the connection
            log.warning("closing a stream: %s", exc)
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
        finally:
            timer.cancel()


def send_buffer_bytes(kib: int | None) -> int | None:
    """``--send-buffer-kib`` in bytes (None stays None)."""
    return None if kib is None else kib * 1024


def uvicorn_http_options(idle_s: float, send_buffer_kib: int | None) -> dict:
    """uvicorn settings for HTTP connections: :func:`http_protocol`, and its keep-alive timeout (how long a connection
    may stay open without a request after a response) set to ``idle_s`` too. uvicorn's own is 5 s, the same as
    httpx's pool (which the openai SDK uses) keeps an idle connection: a client that reuses one at 5 s races the
    server's close and gets a read error on a request it never sent; the server's timeout must be the longer one."""
    return {"http": http_protocol(idle_s, send_buffer_bytes(send_buffer_kib)), "timeout_keep_alive": idle_s}


def http_protocol(idle_s: float, send_buffer_bytes: int | None = None) -> type:
    """uvicorn's HTTP protocol (httptools where installed, else h11), closing idle connections and setting each
    connection's kernel send buffer (:func:`closing_idle`)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return closing_idle(AutoHTTPProtocol, idle_s, send_buffer_bytes)


def closing_idle(protocol_class: type, idle_s: float, send_buffer_bytes: int | None = None) -> type:
    """``protocol_class`` (one of uvicorn's HTTP protocols) that closes a connection which sent no byte within
    ``idle_s`` of opening (uvicorn's keep-alive timeout only starts after a first response), and sets its socket's
    send buffer to ``send_buffer_bytes`` (None: the kernel's, which grows by itself)."""

    class ClosingIdle(protocol_class):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            sock = transport.get_extra_info("socket")
            if send_buffer_bytes is not None and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
            super().connection_made(transport)
            self._turncache_heard = False
            self._turncache_idle = asyncio.get_running_loop().call_later(idle_s, self._turncache_close_if_idle)

        def data_received(self, data: bytes) -> None:
            self._turncache_heard = True
            super().data_received(data)

        def connection_lost(self, exc) -> None:
            self._turncache_idle.cancel()
            super().connection_lost(exc)

        def _turncache_close_if_idle(self) -> None:
            if not self._turncache_heard and not self.transport.is_closing():
                self.transport.close()

    ClosingIdle.__name__ = f"ClosingIdle{protocol_class.__name__}"
    return ClosingIdle
