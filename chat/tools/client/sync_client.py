""":class:`ChatClient`: the blocking face of :class:`~chat.tools.client.async_client.AsyncChatClient`.

The client owns a private event loop running in a daemon thread; every method submits a coroutine to it and waits.
So it works from plain scripts, from threads, and from inside a running event loop's thread (e.g. Jupyter), and
:meth:`ChatClient.cancel` may be called from another thread, or from ``on_delta``, while a turn streams::

    with ChatClient("ws://127.0.0.1:8000/v1/ws") as client:
        client.create_session(system="You are concise.")
        reply = client.send("Hello!", on_delta=lambda d: print(d, end="", flush=True))
        print(reply.usage.prompt_tokens_details.cached_tokens)

``on_delta`` runs in the calling thread, between deltas; deltas that arrive meanwhile are buffered.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from chat.protocol.server_events import Conversation, SessionInfo
from chat.tools.client.async_client import _KEEP, AsyncChatClient, ReplyStream, Sampling, Tools
from chat.tools.client.reply import Reply

T = TypeVar("T")
OnDelta = Callable[[str], object] | None


class ChatClient:
    """A blocking chat client on one WebSocket. Connects on construction; use ``with`` or call :meth:`close`.

    Raises what :class:`AsyncChatClient` raises (one hierarchy under :class:`~chat.tools.client.errors.ClientError`).
    """

    def __init__(
        self, url: str, *, token: str | None = None, timeout: float | None = 300.0, open_timeout: float = 10.0
    ) -> None:
        self._loop = asyncio.new_event_loop()  # runs forever in _thread until close()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chat-client-loop", daemon=True)
        self._thread.start()
        self._client = AsyncChatClient(url, token=token, timeout=timeout, open_timeout=open_timeout)
        try:
            self._call(self._client.connect())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def url(self) -> str:
        return self._client.url

    @property
    def session(self) -> SessionInfo | None:
        """The bound session, as last reported by the server."""
        return self._client.session

    def close(self) -> None:
        """Close the WebSocket and stop the loop thread. Safe to call twice."""
        if self._loop.is_closed():
            return
        try:
            self._call(self._client.close())
        finally:
            self._stop_loop()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_session(
        self, *, system: str | None = None, sampling: Sampling | None = None, model: str | None = None
    ) -> SessionInfo:
        return self._call(self._client.create_session(system=system, sampling=sampling, model=model))

    def resume_session(self, session_id: str) -> SessionInfo:
        return self._call(self._client.resume_session(session_id))

    def update_session(self, *, system: str | None = _KEEP, sampling: Sampling | None = None) -> SessionInfo:
        return self._call(self._client.update_session(system=system, sampling=sampling))

    def conversation(self) -> Conversation:
        return self._call(self._client.conversation())

    def ping(self) -> None:
        self._call(self._client.ping())

    def send(self, *content: Any, tools: Tools = None, tool_choice: Any = None, on_delta: OnDelta = None) -> Reply:
        """A new user turn; returns the finished reply. See :meth:`AsyncChatClient.send` for ``content`` and tools."""
        return self._run(self._client.send(*content, tools=tools, tool_choice=tool_choice), on_delta)

    def send_tool_results(
        self,
        results: Mapping[str, str] | Iterable[tuple[str, str]],
        *,
        tools: Tools = None,
        tool_choice: Any = None,
        on_delta: OnDelta = None,
    ) -> Reply:
        """Answer the last reply's tool calls (call id -> result); returns the reply that follows them."""
        return self._run(self._client.send_tool_results(results, tools=tools, tool_choice=tool_choice), on_delta)

    def regenerate(self, *, tools: Tools = None, tool_choice: Any = None, on_delta: OnDelta = None) -> Reply:
        return self._run(self._client.regenerate(tools=tools, tool_choice=tool_choice), on_delta)

    def edit(
        self,
        *content: Any,
        index: int | None = None,
        message_id: str | None = None,
        tools: Tools = None,
        tool_choice: Any = None,
        on_delta: OnDelta = None,
    ) -> Reply:
        stream = self._client.edit(*content, index=index, message_id=message_id, tools=tools, tool_choice=tool_choice)
        return self._run(stream, on_delta)

    def complete(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        sampling: Sampling | None = None,
        model: str | None = None,
        tools: Tools = None,
        tool_choice: Any = None,
        on_delta: OnDelta = None,
    ) -> Reply:
        """Stateless mode: the whole message list in, one reply out (tools as in :meth:`send`)."""
        stream = self._client.complete(
            list(messages), sampling=sampling, model=model, tools=tools, tool_choice=tool_choice
        )
        return self._run(stream, on_delta)

    def cancel(self, turn_id: str | None = None) -> None:
        """Ask the server to stop a turn; thread-safe, so it may be called while another thread is in :meth:`send`."""
        self._call(self._client.cancel(turn_id))

    # ---------------------------------------------------------------- internals

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _run(self, stream: ReplyStream, on_delta: OnDelta) -> Reply:
        if on_delta is None:
            return self._call(_await(stream))
        deltas = aiter(stream)
        while True:
            try:
                delta = self._call(_anext(deltas))
            except StopAsyncIteration:
                break
            on_delta(delta)
        assert stream.reply is not None
        return stream.reply

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _await(stream: ReplyStream) -> Reply:
    return await stream


async def _anext(deltas: AsyncIterator[str]) -> str:
    return await anext(deltas)
