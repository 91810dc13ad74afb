""":class:`AsyncChatClient`: the chat WebSocket protocol (docs/protocol.md) for asyncio code.

One client is one WebSocket. A reader task reads every server event and routes it by ``reply_to`` to the request
that asked for it (each request gets a fresh ``event_id``), so several requests may be outstanding at once, e.g. a
``conversation()`` while a reply streams. Turns are :class:`ReplyStream` objects: iterate them for text deltas, or
await them for the whole :class:`~chat.tools.client.reply.Reply`::

    async with AsyncChatClient("ws://127.0.0.1:8000/v1/ws") as client:
        await client.create_session(system="You are concise.", sampling={"max_tokens": 64})
        reply = await client.send("What is in this picture?", Path("cat.png"))
        print(reply.text, reply.cached_tokens, reply.ttft_ms)
        async for delta in client.send("And the colours?"):
            print(delta, end="")

Errors: a server ``error`` event raises its :class:`~chat.tools.client.errors.ChatError` subclass; a lost connection
raises :class:`~chat.tools.client.errors.ConnectionLost` from every waiting call and from every later one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Generator, Iterable, Mapping
from typing import Any

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from chat.protocol.limits import MAX_FRAME_BYTES
from chat.protocol.parser import parse_server_event
from chat.protocol.sampling import SamplingSettings
from chat.protocol.server_events import (
    Conversation,
    ErrorEvent,
    Pong,
    ReplyDelta,
    ReplyDone,
    ServerEvent,
    SessionCreated,
    SessionInfo,
    SessionResumed,
    SessionUpdated,
    TurnStarted,
)
from chat.tools.client.errors import (
    ChatConnectionError,
    ChatTimeout,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    UnexpectedServerEvent,
    error_for,
)
from chat.tools.client.media import to_content
from chat.tools.client.reply import Reply

Sampling = Mapping[str, Any] | SamplingSettings
Tools = Iterable[Mapping[str, Any]] | None  # OpenAI function definitions: {"type": "function", "function": {...}}
_KEEP: Any = object()  # update_session(system=...) default: leave the system prompt as it is


class _Pending:
    """The events answering one client event, in arrival order. The reader fills it; one caller drains it."""

    def __init__(self, turn: bool) -> None:
        self.turn = turn  # a turn ends with reply.done (or a refusal); any other request with its first answer
        self.events: asyncio.Queue[ServerEvent | ClientError] = asyncio.Queue()  # a ClientError ends it early

    def ends_with(self, event: ServerEvent) -> bool:
        if not self.turn:
            return True
        return isinstance(event, ReplyDone) or (isinstance(event, ErrorEvent) and event.turn_id is None)


class AsyncChatClient:
    """A chat client on one WebSocket. Use ``async with``, or ``await connect()`` and ``await close()``.

    Not thread-safe: use it from one event loop (see :class:`chat.tools.client.ChatClient` for blocking code).
    """

    def __init__(
        self, url: str, *, token: str | None = None, timeout: float | None = 300.0, open_timeout: float = 10.0
    ) -> None:
        self.url = url  # ws://HOST:PORT/v1/ws
        self.timeout = timeout  # seconds to wait for the next event of a request; None: forever
        self.open_timeout = open_timeout  # seconds to open the WebSocket
        self.session: SessionInfo | None = None  # the bound session, as last reported by the server
        self._token = token  # sent as "Authorization: Bearer <token>"
        self._ws: ClientConnection | None = None  # the open WebSocket
        self._reader: asyncio.Task[None] | None = None  # routes server events to _pending
        self._pending: dict[str, _Pending] = {}  # by event_id; removed when its last event arrives
        self._ids = itertools.count(1)  # event_id counter
        self._gone: ChatConnectionError | None = None  # why the connection is unusable, once it is

    # ---------------------------------------------------------------- connection

    async def connect(self) -> AsyncChatClient:
        """Open the WebSocket.

        Raises:
            ConnectFailed: refused, unreachable, timed out, bad URL, or the handshake was rejected (``status`` 403:
                missing or wrong token).
        """
        if self._ws is not None or self._gone is not None:
            raise ClientError("connect() may be called once per client")
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        try:
            self._ws = await connect(
                self.url, additional_headers=headers, max_size=None, open_timeout=self.open_timeout
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            hint = ": missing or wrong token, or origin not allowed" if status == 403 else ""
            raise ConnectFailed(f"{self.url} refused the WebSocket handshake (HTTP {status}){hint}", status) from exc
        except (OSError, TimeoutError, InvalidURI, InvalidHandshake) as exc:
            raise ConnectFailed(f"cannot connect to {self.url}: {exc}") from exc
        self._reader = asyncio.create_task(self._read(), name="chat-client-reader")
        return self

    async def close(self) -> None:
        """Close the WebSocket; waiting calls raise :class:`ConnectionLost`. Turns still running are cancelled by
        the server. Safe to call twice."""
        self._fail(ConnectionLost("the client was closed"))
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def __aenter__(self) -> AsyncChatClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- sessions

    async def create_session(
        self, *, system: str | None = None, sampling: Sampling | None = None, model: str | None = None
    ) -> SessionInfo:
        """Start a session and bind it to this connection (``session.create``).

        Raises:
            SessionError: ``unknown_model``. BusyError: the server is full. InvalidRequestError: bad sampling.
        """
        event = _event("session.create", model=model, system=system, sampling=_sampling(sampling))
        answer = await self._request(event, SessionCreated)
        self.session = answer.session
        return answer.session

    async def resume_session(self, session_id: str) -> SessionInfo:
        """Bind an existing session to this connection (``session.resume``), e.g. after a reconnect.

        Raises:
            SessionError: ``unknown_session``.
        """
        answer = await self._request(_event("session.resume", session_id=session_id), SessionResumed)
        self.session = answer.session
        return answer.session

    async def update_session(self, *, system: str | None = _KEEP, sampling: Sampling | None = None) -> SessionInfo:
        """Change the session's settings for the next turns; only what is given changes (``system=None`` removes the
        system prompt)."""
        event = _event("session.update", sampling=_sampling(sampling))
        if system is not _KEEP:
            event["system"] = system
        answer = await self._request(event, SessionUpdated)
        self.session = answer.session
        return answer.session

    async def conversation(self) -> Conversation:
        """The session's conversation (``conversation.get``): ``.messages``, and ``.generating`` if a turn runs."""
        return await self._request(_event("conversation.get"), Conversation)

    async def ping(self) -> None:
        """Round trip to the server (``ping`` -> ``pong``)."""
        await self._request(_event("ping"), Pong)

    # ---------------------------------------------------------------- turns

    def send(self, *content: Any, tools: Tools = None, tool_choice: Any = None) -> ReplyStream:
        """A new user turn (``turn.create``). ``content``: one string, or several items (text, paths, bytes, PIL
        images, :class:`~chat.tools.client.media.Audio` ...) that become content parts; see
        :mod:`chat.tools.client.media`. ``tools`` (OpenAI function definitions) and ``tool_choice`` offer this turn
        tools: a reply that calls them ends with ``finish_reason == "tool_calls"`` and its calls in
        :attr:`Reply.tool_calls`; answer them with :meth:`send_tool_results`.

        Nothing is sent until the stream is awaited or iterated.
        """
        offered = _tools(tools, tool_choice)
        return ReplyStream(self, lambda: _event("turn.create", content=_content(content), **offered))

    def send_tool_results(
        self, results: Mapping[str, str] | Iterable[tuple[str, str]], *, tools: Tools = None, tool_choice: Any = None
    ) -> ReplyStream:
        """Answer the last reply's tool calls (``tool.results``): ``results`` maps each call's id to what it returned
        (text, often JSON); the reply that follows them streams as :meth:`send`'s. Offer ``tools`` again if the reply
        may call them again."""
        pairs = list(results.items()) if isinstance(results, Mapping) else list(results)
        wire = [{"tool_call_id": call_id, "content": content} for call_id, content in pairs]
        offered = _tools(tools, tool_choice)
        return ReplyStream(self, lambda: _event("tool.results", results=wire, **offered))

    def regenerate(self, *, tools: Tools = None, tool_choice: Any = None) -> ReplyStream:
        """Generate the last reply again (``turn.regenerate``); the old one is replaced when the new one is done."""
        offered = _tools(tools, tool_choice)
        return ReplyStream(self, lambda: _event("turn.regenerate", **offered))

    def edit(
        self,
        *content: Any,
        index: int | None = None,
        message_id: str | None = None,
        tools: Tools = None,
        tool_choice: Any = None,
    ) -> ReplyStream:
        """Replace an earlier user message (by ``index`` in the conversation, or ``message_id``) and generate from
        there (``turn.edit``); every later message is dropped."""
        offered = _tools(tools, tool_choice)
        return ReplyStream(
            self,
            lambda: _event("turn.edit", index=index, message_id=message_id, content=_content(content), **offered),
        )

    def complete(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        sampling: Sampling | None = None,
        model: str | None = None,
        tools: Tools = None,
        tool_choice: Any = None,
    ) -> ReplyStream:
        """Stateless mode (``completion.create``): the whole message list in, one reply out; no session needed.

        ``messages`` are ``{"role": ..., "content": ...}``; content is converted like :meth:`send`'s. An assistant
        message may carry its reply's ``tool_calls`` (as :attr:`Reply.tool_calls` gives them) and a ``tool`` message
        the ``tool_call_id`` it answers; ``tools`` and ``tool_choice`` offer this reply tools, as in :meth:`send`.
        """
        offered = _tools(tools, tool_choice)

        def build() -> dict[str, Any]:
            wire = [_wire_message(m) for m in messages]
            return _event("completion.create", messages=wire, model=model, sampling=_sampling(sampling), **offered)

        return ReplyStream(self, build)

    async def cancel(self, turn_id: str | None = None) -> None:
        """Ask the server to stop a turn (``turn.cancel``; without ``turn_id``: whatever this connection runs).

        Returns once the request is sent; the turn's stream then ends with ``finish_reason == "cancelled"``.
        Cancelling a turn that already ended is harmless (the server's ``not_generating`` answer is ignored).
        """
        await self._send(_event("turn.cancel", turn_id=turn_id))

    # ---------------------------------------------------------------- internals

    async def _request(self, event: dict[str, Any], expected: type[Any]) -> Any:
        pending = await self._open(event, turn=False)
        answer = await self._next(pending)
        if isinstance(answer, ErrorEvent):
            raise error_for(answer.code, answer.message)
        if not isinstance(answer, expected):
            raise UnexpectedServerEvent(f"expected {expected.__name__}, got {answer.type}")
        return answer

    async def _open(self, event: dict[str, Any], *, turn: bool) -> _Pending:
        """Register ``event``'s answers, then send it."""
        event["event_id"] = f"c{next(self._ids)}"
        pending = _Pending(turn)
        self._pending[event["event_id"]] = pending
        try:
            await self._send(event)
        except BaseException:
            self._pending.pop(event["event_id"], None)
            raise
        return pending

    async def _next(self, pending: _Pending) -> ServerEvent:
        try:
            item = await asyncio.wait_for(pending.events.get(), self.timeout)
        except TimeoutError:
            error = ChatTimeout(f"no answer from {self.url} within {self.timeout} s")
            self._fail(error)
            if self._ws is not None:
                await self._ws.close()
            raise error from None
        if isinstance(item, ClientError):
            raise item
        return item

    async def _send(self, event: dict[str, Any]) -> None:
        if self._gone is not None:
            raise self._gone
        if self._ws is None:
            raise ChatConnectionError("not connected: use `async with AsyncChatClient(...)` or `await connect()`")
        event.setdefault("event_id", f"c{next(self._ids)}")
        frame = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        if len(frame) > MAX_FRAME_BYTES or len(frame.encode()) > MAX_FRAME_BYTES:
            raise error_for("frame_too_large", f"the event is larger than {MAX_FRAME_BYTES} bytes (checked locally)")
        try:
            await self._ws.send(frame)
        except ConnectionClosed as exc:
            raise self._lost(exc) from None

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for frame in self._ws:
                try:
                    event = parse_server_event(frame)
                except ValidationError as exc:
                    self._fail(UnexpectedServerEvent(f"the server sent a frame that is not a server event: {exc}"))
                    await self._ws.close()
                    return
                self._route(event)
            self._lost(None)
        except ConnectionClosed as exc:
            self._lost(exc)
        except Exception as exc:  # a socket error, or a bug: never leave a request waiting for the timeout
            self._fail(ConnectionLost(f"the connection to {self.url} failed: {exc!r}"))

    def _route(self, event: ServerEvent) -> None:
        pending = self._pending.get(event.reply_to or "")
        if pending is None:
            return  # unanswered on purpose: e.g. the not_generating answer to a cancel
        pending.events.put_nowait(event)
        if pending.ends_with(event):
            del self._pending[event.reply_to or ""]

    def _lost(self, exc: ConnectionClosed | None) -> ChatConnectionError:
        if self._gone is not None:
            return self._gone
        close = exc.rcvd if exc is not None else (self._ws.close_rcvd if self._ws is not None else None)
        code = close.code if close is not None else None
        reason = f" (close code {code}{': ' + close.reason if close and close.reason else ''})" if code else ""
        error = ConnectionLost(f"the connection to {self.url} was lost{reason}", code)
        self._fail(error)
        return error

    def _fail(self, error: ChatConnectionError | ClientError) -> None:
        """Make the client unusable: every waiting request gets ``error``, later ones too."""
        if self._gone is None:
            self._gone = error if isinstance(error, ChatConnectionError) else ConnectionLost(str(error))
        for pending in self._pending.values():
            pending.events.put_nowait(error)
        self._pending.clear()


class ReplyStream:
    """One turn: iterate for text deltas (``async for delta in stream``), or ``await`` it for the :class:`Reply`.

    The turn is sent when first iterated or awaited (or by :meth:`start`). After the last delta, :attr:`reply`
    holds the finished reply. A failed turn raises its :class:`ChatError` (``.reply`` set) at the end of the
    iteration; a refused one raises at the start.
    """

    def __init__(self, client: AsyncChatClient, build: Any) -> None:
        self.turn_id: str | None = None  # known once the server sent turn.started
        self.started: TurnStarted | None = None  # the server's turn.started
        self.reply: Reply | None = None  # the finished turn, after the iteration ended
        self._client = client
        self._build = build  # () -> the client event; called once, when the turn is sent
        self._pending: _Pending | None = None  # the turn's events, once sent
        self._error: ClientError | None = None  # how the turn failed, re-raised on a second await
        self._consumed = False  # the iteration ran to its end

    async def start(self) -> str:
        """Send the turn (once) and wait for ``turn.started``; return the turn id.

        Raises:
            ChatError: the event was refused (``busy``, ``invalid_event``, ``invalid_media``, ...).
        """
        if self._error is not None:
            raise self._error
        if self.turn_id is not None:
            return self.turn_id
        if self._pending is None:
            event = self._build()
            self._pending = await self._client._open(event, turn=True)
        first = await self._next()
        if isinstance(first, ErrorEvent):  # refused: nothing started
            self._error = error_for(first.code, first.message)
            raise self._error
        if not isinstance(first, TurnStarted):
            raise UnexpectedServerEvent(f"expected turn.started, got {first.type}")
        self.started, self.turn_id = first, first.turn_id
        return first.turn_id

    def __aiter__(self) -> AsyncIterator[str]:
        return self._deltas()

    def __await__(self) -> Generator[Any, None, Reply]:
        return self._drain().__await__()

    async def cancel(self) -> None:
        """Ask the server to stop this turn; the iteration then ends with ``finish_reason == "cancelled"``."""
        if self._pending is not None and self.reply is None:
            await self._client.cancel(self.turn_id)

    async def _drain(self) -> Reply:
        async for _ in self:
            pass
        if self._error is not None:
            raise self._error
        assert self.reply is not None
        return self.reply

    async def _deltas(self) -> AsyncIterator[str]:
        if self._consumed:
            return
        await self.start()
        failure: ErrorEvent | None = None
        while True:
            event = await self._next()
            if isinstance(event, ReplyDelta):
                if event.delta:
                    yield event.delta
            elif isinstance(event, ErrorEvent):
                failure = event  # the turn failed; its reply.done follows
            elif isinstance(event, ReplyDone):
                self._consumed = True
                self.reply = Reply.of(event)
                if failure is not None or event.finish_reason == "error":
                    code, message = (failure.code, failure.message) if failure else ("internal", "the turn failed")
                    self._error = error_for(code, message, event.turn_id, self.reply)
                    raise self._error
                return

    async def _next(self) -> ServerEvent:
        assert self._pending is not None
        try:
            return await self._client._next(self._pending)
        except ClientError as exc:
            self._error = exc
            raise


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    """A client event (the client adds its ``event_id`` when sending); fields that are None are left out."""
    return {"type": kind, **{k: v for k, v in fields.items() if v is not None}}


def _sampling(sampling: Sampling | None) -> dict[str, Any] | None:
    if sampling is None:
        return None
    if isinstance(sampling, SamplingSettings):
        return sampling.model_dump(exclude_unset=True)
    return dict(sampling)


def _wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message of a ``completion.create`` list: its content converted like :meth:`AsyncChatClient.send`'s, and its
    tool fields as given (calls as dicts or as the wire models :attr:`Reply.tool_calls` holds)."""
    wire: dict[str, Any] = {"role": message["role"], "content": _content((message.get("content") or "",))}
    if message.get("tool_calls"):
        wire["tool_calls"] = [c.model_dump() if hasattr(c, "model_dump") else dict(c) for c in message["tool_calls"]]
    if message.get("tool_call_id") is not None:
        wire["tool_call_id"] = message["tool_call_id"]
    return wire


def _tools(tools: Tools, tool_choice: Any) -> dict[str, Any]:
    return {"tools": [dict(t) for t in tools] if tools is not None else None, "tool_choice": tool_choice}


def _content(items: tuple[Any, ...]) -> Any:
    if len(items) == 1:
        return to_content(items[0])
    return to_content(list(items))
