"""The chat WebSocket (``/v1/ws``): a thin loop around :class:`chat.protocol.connection.Connection`.

Frames in -> ``Connection.receive`` -> events out, turns to the engine, cancels to the engine. Engine results come back
on the engine's thread and are marshalled onto the event loop by the loop's relay (``chat/server/transport/relay.py``:
one wake-up per engine step for every socket), where the connection turns them into ``reply.delta`` / ``reply.done``.
All sends go through one queue, so events of one socket never interleave mid-frame.

A turn that offers tools is built as ``/v1/chat/completions`` builds one (``chat.server.reply.tools_api``: the same
checks, call formats and grammars; the tools are checked before the event reaches the session, so a refused one changes
nothing); its reply is held back until it is done, then sent as its text, its ``reply.tool_call`` events and its
``reply.done``. Every turn's reply is read back by the reply reader the HTTP surfaces use
(``chat.server.reply.reader``: its calls, its settle step), its thinking left in the text.

Refusals before any exchange: a browser ``Origin`` that is not allowed, or a missing or unknown key when keys are
configured, closes with 1008 (policy violation). When a reload of the keys removes the socket's key (or gives it to
another tenant), the socket sends a ``key_revoked`` error, closes with 1008 (reason ``key_revoked``) and cancels its
turns. An event that would start a turn over the tenant's limits gets a ``rate_limited`` error before the
connection sees it. The key's tenant (``chat.server.tenancy.auth``) owns the sessions the socket
creates, is the only one that can resume them, and salts the cache entries of its turns. A frame over the size limit
closes with 1009 (uvicorn enforces ``ws_max_size``). Close codes and every error's wire code come from the one table
in ``chat/server/errors.py``; turns are built, and their usage and timings reported, by
``chat/server/reply/turns.py``, as on HTTP. A client that goes away cancels its turns; each stops within one engine
step.

An event that acknowledges a change to a session (``session.created``, ``session.updated``, a ``reply.done`` that
committed a reply) is sent once the store has written that change (``SessionStore.when_written``), so a client that
saw it finds it after a crash; the event loop never waits on the disk, and a slow disk delays only that socket's
events, by at most ``WRITE_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

from fastapi import WebSocket, WebSocketDisconnect

from chat.engine.engine import Engine, JobHandle
from chat.engine.errors import NoChatTemplateError
from chat.engine.events import Delta, Done, TurnRequest
from chat.protocol.client_events import CompletionCreate, ToolResults, TurnCreate, TurnEdit, TurnRegenerate
from chat.protocol.connection import Connection, Step
from chat.protocol.errors import ErrorCode, ProtocolError
from chat.protocol.parser import parse_client_event, serialize_server_event
from chat.protocol.server_events import ErrorEvent, ReplyDone, SessionCreated, SessionUpdated
from chat.protocol.session import TurnPlan
from chat.protocol.store import SessionStore
from chat.protocol.tools import AssistantToolCall
from chat.server.errors import TRANSPORT, RequestError, code_of, describe
from chat.server.reply import reasoning_api, tools_api
from chat.server.reply.adapters import AdapterSelector, LiveModels, with_adapter
from chat.server.reply.choices import chat_logprobs
from chat.server.reply.reader import CallsOut, Failed, Finished, ReplyEvent, ReplyReader, TextOut
from chat.server.reply.turns import chats, turn_request, wire_timings, wire_usage
from chat.server.tenancy.auth import KeyRing, Tenant, bearer_of
from chat.server.tenancy.key_store import KeyStore
from chat.server.tenancy.tenant_gate import TenantGate
from chat.server.transport.backpressure import Pacer
from chat.server.transport.relay import relay_for

log = logging.getLogger("turncache.ws")
FAILED = "the model failed while generating"  # what a client learns of a turn that failed while generating
WRITE_WAIT_S = 1.0  # the longest an acknowledgment waits for its session's write before it is sent anyway
STARTS_A_TURN = (TurnCreate, TurnRegenerate, TurnEdit, ToolResults, CompletionCreate)  # a tenant's limits apply
OFFERS_TOOLS = (
    TurnCreate,
    TurnRegenerate,
    TurnEdit,
    ToolResults,
    CompletionCreate,
)  # events whose tools are checked before anything


def origin_allowed(origin: str | None, host: str | None, allowed: list[str]) -> bool:
    """No Origin (not a browser), the server's own origin, or one configured as allowed."""
    if origin is None:
        return True
    if origin in allowed:
        return True
    return host is not None and urlsplit(origin).netloc == host


def credential_of(ws: WebSocket) -> str | None:
    """The key a socket presents: the ``Authorization: Bearer`` header, else the ``token`` query parameter."""
    given = bearer_of(ws.headers.get("authorization"))
    return given if given is not None else ws.query_params.get("token")


class ChatSocket:
    """One accepted WebSocket."""

    def __init__(
        self,
        ws: WebSocket,
        engine: Engine,
        store: SessionStore,
        model_name: str,
        tenant: Tenant,
        gate: TenantGate,
        reply_cap: int | None = None,
        credential: str | None = None,
        max_pending: int | None = None,
        send_timeout_s: float | None = None,
        adapters: AdapterSelector | None = None,
    ) -> None:
        self.ws = ws
        self.engine = gate.engine_for(engine, tenant.id)  # the tenant's view: default priority, turn accounting
        self.gate = gate  # admits the tenant's turns against its limits
        self.tenant = tenant  # who the client is
        self.credential = credential  # the key it presented: checked again when the keys are reloaded
        self.store = store  # where sessions live
        self.conn = Connection(store, models=[model_name], tenant=tenant.id)
        self.adapters = adapters  # a session's `model` may name a LoRA adapter loaded now (chat.server.reply.adapters)
        if adapters is not None:
            self.conn.models = LiveModels(adapters)
        self.salt = tenant.salt  # the tenant's cache namespace salt
        self.reply_cap = reply_cap  # reply length of a turn without max_tokens (None: the context's room)
        self.loop = asyncio.get_running_loop()
        self.relay = relay_for(self.loop)  # engine events onto the loop, one wake-up per engine step for all sockets
        # serialized events, futures the writer waits for (a session's write) before the events after them, and a
        # close code (the writer closes the socket with it and ends)
        self.outbox: asyncio.Queue[str | asyncio.Future | int | None] = asyncio.Queue()  # None ends the writer
        self.jobs: dict[str, JobHandle] = {}  # running turns by turn id
        self.turn_sessions: dict[str, str] = {}  # running session turns -> their session id
        self.readers: dict[str, ReplyReader] = {}  # running turns -> how their reply is read back (tools, thinking)
        self.open = True  # False once the client is gone: events are then dropped
        self.max_pending = max_pending  # most frames waiting in the outbox for a slow client (None: no bound)
        self.send_timeout_s = send_timeout_s  # the longest one frame may wait for the client to read (None: forever)
        self.reader: asyncio.Task | None = None  # the task reading frames, cancelled when the client reads too slowly
        self.too_slow = False  # the client read too slowly: the socket is being dropped
        # pauses the socket's turns while its client has too many frames unread (None: no bound, no pausing)
        self.pacer = Pacer(self.jobs.values, max_pending) if max_pending is not None else None

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        self.reader = asyncio.current_task()
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                frame = message.get("text")
                if frame is None:
                    frame = message.get("bytes") or b""
                self._handle(frame)
        except WebSocketDisconnect:
            pass
        except asyncio.CancelledError:
            if not self.too_slow:
                raise
        finally:
            self.open = False
            for turn_id in self.conn.close():
                job = self.jobs.get(turn_id)
                if job is not None:
                    job.cancel()
            self.outbox.put_nowait(None)
            with contextlib.suppress(Exception):
                await writer

    def _send(self, events, written: str | None = None) -> None:
        """Queue ``events``; with ``written``, only after that session's pending writes (see the module docstring)."""
        if not self.open:
            return
        if written is not None:
            future = self.loop.create_future()

            def release() -> None:
                if not future.done():
                    future.set_result(None)

            self.store.when_written(written, lambda: self.loop.call_soon_threadsafe(release))
            self.outbox.put_nowait(future)
        for event in events:
            self.outbox.put_nowait(serialize_server_event(event))
        if self.max_pending is None:
            return
        if self.outbox.qsize() > self.max_pending:
            self._drop_slow_client(f"the client left more than {self.max_pending} events unread")
        elif self.pacer is not None:
            self.pacer.unread(self.outbox.qsize())

    def _drop_slow_client(self, why: str) -> None:
        """The client does not read (chat.server.transport.backpressure): cancel its turns at once and end the socket
        (the server then closes the connection; a close frame with 1013 is sent if the client's socket takes it)."""
        if self.too_slow:
            return
        log.warning("closing a WebSocket: %s", why)
        self.too_slow, self.open = True, False
        for job in self.jobs.values():
            job.cancel()
        code = TRANSPORT[ErrorCode.SLOW_CLIENT].ws_close
        self.outbox = asyncio.Queue()  # what the client did not read is dropped
        self.outbox.put_nowait(code if code is not None else None)
        if self.reader is not None:
            self.reader.cancel()

    def on_keys(self, ring: KeyRing) -> None:
        """The keys were reloaded (any thread): close this socket if its key was removed or changed tenant."""
        self.loop.call_soon_threadsafe(self._check_key, ring)

    def _check_key(self, ring: KeyRing) -> None:
        tenant = ring.authenticate(self.credential)
        if tenant is not None and tenant.id == self.tenant.id:
            self.tenant = tenant  # an admin flag may have changed; limits are looked up at each request
            return
        reason = "the key of this connection was removed from the server's keys"
        self._send([ErrorEvent(code=ErrorCode.KEY_REVOKED, message=reason)])
        code = TRANSPORT[ErrorCode.KEY_REVOKED].ws_close
        if self.open and code is not None:
            self.outbox.put_nowait(code)
            self.open = False  # nothing more is sent; the reader sees the close and cancels the turns

    async def _write(self) -> None:
        """Send the outbox's frames in order. One timer per socket watches the write in progress: a frame the client
        does not take within ``send_timeout_s`` drops the socket as too slow (an ``asyncio.timeout`` around every
        write made and cancelled a timer per frame: per token and socket)."""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        limit = self.send_timeout_s
        since: float | None = None  # when the write in progress began (None: none is)
        timed_out = False
        timer: asyncio.TimerHandle | None = None

        def watch() -> None:  # on the loop: cancel the writer inside a write that waited too long
            nonlocal timed_out, timer
            assert limit is not None
            if since is not None and loop.time() - since >= limit:
                timed_out = True
                task.cancel()
                return
            timer = loop.call_later(limit if since is None else since + limit - loop.time(), watch)

        if limit is not None:
            timer = loop.call_later(limit, watch)
        try:
            while (frame := await self.outbox.get()) is not None:
                if self.pacer is not None:  # the client took a frame: the turns go on once it has caught up
                    self.pacer.unread(self.outbox.qsize())
                if isinstance(frame, int):
                    reason = ErrorCode.SLOW_CLIENT if self.too_slow else ErrorCode.KEY_REVOKED
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(self.send_timeout_s):
                            await self.ws.close(code=frame, reason=reason.value)
                    return
                if isinstance(frame, asyncio.Future):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(frame, WRITE_WAIT_S)
                    continue
                since = loop.time()
                try:
                    await self.ws.send_text(frame)
                except asyncio.CancelledError:
                    if not timed_out:
                        raise
                    task.uncancel()
                    self._drop_slow_client(f"a frame waited more than {self.send_timeout_s} s for the client")
                    return
                except Exception:  # the client is gone; the reader notices and cleans up
                    self.open = False
                    return
                finally:
                    since = None
        finally:
            if timer is not None:
                timer.cancel()

    def _handle(self, frame: str | bytes) -> None:
        step = self._receive(frame)
        changed = [e.session.id for e in step.send if isinstance(e, SessionCreated | SessionUpdated)]
        self._send(step.send, written=changed[0] if changed else None)
        for turn_id in step.cancel:
            job = self.jobs.get(turn_id)
            if job is not None:
                job.cancel()
        if step.start is not None:
            self._start(step.start)

    def _receive(self, frame: str | bytes) -> Step:
        """``Connection.receive``, with the tenant's limits checked before an event that starts a turn reaches the
        connection: a refused one changes nothing (no ``turn.started``, the session as it was)."""
        try:
            event = parse_client_event(frame)
            if isinstance(event, STARTS_A_TURN) and not chats(self.engine.runtime):  # a base model: refused
                exc = NoChatTemplateError(self.engine.runtime.name)  # before anything else, the session unchanged
                return Step(send=(ErrorEvent(reply_to=event.event_id, code=code_of(exc), message=str(exc)),))
            if isinstance(event, OFFERS_TOOLS):
                check_tools(event, self.engine.runtime)
            if isinstance(event, STARTS_A_TURN):
                refusal = self.gate.check(self.tenant.id)
                if refusal is not None:
                    error = ErrorEvent(reply_to=event.event_id, code=ErrorCode.RATE_LIMITED, message=refusal.message)
                    return Step(send=(error,))
            step = self.conn.handle(event)
        except ProtocolError as exc:
            return Step(send=(ErrorEvent.of(exc),))
        if step.start is not None:
            self.gate.record(self.tenant.id)
        return step

    def _start(self, plan: TurnPlan) -> None:
        if plan.session_id is not None:
            self.turn_sessions[plan.turn_id] = plan.session_id
        try:
            adapter = self.adapters.select(plan.model) if self.adapters is not None else None
            request, reader = build_turn(plan, self.salt, self.engine.runtime, self.reply_cap, self.engine, adapter)
            self.readers[plan.turn_id] = reader
            relay, turn_id = self.relay, plan.turn_id
            self.jobs[turn_id] = self.engine.submit(request, lambda event: relay.call(self._on_event, turn_id, event))
            if self.pacer is not None and self.pacer.paused:
                self.jobs[turn_id].pause()  # its stream waits behind what the client has not read yet
        except Exception as exc:  # media the model does not take, a closed engine, a bug: this turn fails alone
            self.turn_sessions.pop(plan.turn_id, None)
            self.readers.pop(plan.turn_id, None)
            self._send(self._failed(plan.turn_id, exc))

    def _on_event(self, turn_id: str, event) -> None:
        """An engine result for one turn, on the event loop, read back by the turn's reply reader (the one every
        HTTP surface uses: ``chat.server.reply.reader``)."""
        reader = self.readers.get(turn_id)
        if isinstance(event, Delta):
            if reader is not None:
                self._send([self._delta(turn_id, out) for out in reader.delta(event) if isinstance(out, TextOut)])
            return
        self.jobs.pop(turn_id, None)
        self.readers.pop(turn_id, None)
        session_id = self.turn_sessions.pop(turn_id, None)
        if isinstance(event, Done) and reader is not None:
            events = self._ended(turn_id, reader, reader.done(event))
        else:
            events = self._failed(turn_id, event)
        committed = any(isinstance(e, ReplyDone) and e.message_id is not None for e in events)
        self._send(events, written=session_id if committed else None)

    def _delta(self, turn_id: str, out: TextOut):
        logprobs = chat_logprobs(self.engine.runtime, out.logprobs) if out.logprobs else None
        return self.conn.on_delta(turn_id, out.text, list(out.token_ids), logprobs)

    def _ended(self, turn_id: str, reader: ReplyReader, outs: list[ReplyEvent]) -> list:
        """The events that end a turn: a held reply's text as one delta and its calls, then its reply.done (or the
        error of a turn that failed while generating)."""
        events: list = []
        calls: list[AssistantToolCall] = []
        for out in outs:
            if isinstance(out, TextOut):
                events.append(self._delta(turn_id, out))
            elif isinstance(out, CallsOut):
                calls = [AssistantToolCall.model_validate(c) for c in tools_api.wire_calls(out.calls)]
                events += [self.conn.on_tool_call(turn_id, i, call) for i, call in enumerate(calls)]
            elif isinstance(out, Failed):
                assert out.done is not None  # a socket's client is never cut by a reader
                log.error("turn %s failed", turn_id, exc_info=out.error)
                usage, timings = wire_usage(out.done), wire_timings(out.done)
                return events + self.conn.on_error(turn_id, ErrorCode.INTERNAL, FAILED, usage, timings)
            elif isinstance(out, Finished):
                usage, timings = wire_usage(out.done), wire_timings(out.done)
                held_calls = calls if reader.held else None  # a held reply's calls (maybe none): as before
                events += self.conn.on_done(turn_id, out.content or "", out.finish, usage, timings, held_calls)
        return events

    def _failed(self, turn_id: str, exc: BaseException) -> list:
        """The events that end a turn that failed with ``exc`` before or instead of a Done."""
        reported = describe(exc)
        if reported.code is ErrorCode.INTERNAL:
            log.error("turn %s failed", turn_id, exc_info=exc)
        return self.conn.on_error(turn_id, reported.code, reported.message)


def build_turn(
    plan: TurnPlan, salt: str, runtime, reply_cap: int | None = None, engine=None, adapter=None
) -> tuple[TurnRequest, ReplyReader]:
    """The engine's request for a session or stateless turn, with its tools rendered in the model's call format and
    its history's calls and results, exactly as ``/v1/chat/completions`` builds it, computed under the LoRA
    ``adapter`` (None: the base model); and how to read its reply (its thinking left in the text, as the protocol
    shows it; settled on ``engine`` when given, under the same adapter).

    Raises:
        UnsupportedMediaError, RequestError, SamplingFieldError.
    """
    tools = tools_api.plan_tools(plan.tools, plan.tool_choice, plan.parallel_tool_calls, runtime)
    fields = tools_api.history_calls(plan.messages)
    request = turn_request(plan.messages, plan.sampling, salt=salt, runtime=runtime, reply_cap=reply_cap)
    request = tools_api.apply(tools, request, fields)
    request = with_adapter(reasoning_api.apply(request, runtime, None, None), adapter)
    markers = reasoning_api.thinking_markers(runtime, None)
    return request, ReplyReader(request, tools, markers, engine=engine, split_thinking=False)


def check_tools(event: TurnCreate | TurnRegenerate | TurnEdit | ToolResults | CompletionCreate, runtime) -> None:
    """Refuse an event whose tools cannot be offered, before it reaches the session (which is then unchanged).

    Raises:
        ProtocolError: ``invalid_grammar`` for a schema that is not JSON Schema, ``invalid_event`` for the rest
            (``tool_choice`` naming no function or without tools, two functions of one name); the message starts
            with the field.
    """
    try:
        tools_api.plan_tools(event.tools, event.tool_choice, event.parallel_tool_calls, runtime)
    except RequestError as exc:
        code = ErrorCode.INVALID_GRAMMAR if exc.code is ErrorCode.INVALID_GRAMMAR else ErrorCode.INVALID_EVENT
        raise ProtocolError(code, str(exc), event.event_id) from None


async def serve_socket(
    ws: WebSocket,
    engine: Engine,
    store: SessionStore,
    model_name: str,
    *,
    keys: KeyStore,
    gate: TenantGate,
    allowed_origins: list[str],
    reply_cap: int | None = None,
    max_pending: int | None = None,
    send_timeout_s: float | None = None,
    adapters: AdapterSelector | None = None,
) -> None:
    if not origin_allowed(ws.headers.get("origin"), ws.headers.get("host"), allowed_origins):
        await ws.close(code=TRANSPORT[ErrorCode.ORIGIN_NOT_ALLOWED].ws_close, reason="origin not allowed")
        return
    credential = credential_of(ws)
    tenant = keys.authenticate(credential)
    if tenant is None:
        await ws.close(code=TRANSPORT[ErrorCode.UNAUTHORIZED].ws_close, reason="missing or wrong token")
        return
    await ws.accept()
    socket = ChatSocket(
        ws, engine, store, model_name, tenant, gate, reply_cap, credential, max_pending, send_timeout_s, adapters
    )
    stop = keys.subscribe(socket.on_keys)
    try:
        await socket.run()
    finally:
        stop()
