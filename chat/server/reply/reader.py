"""The one reply reader: a turn's engine events (:class:`~chat.engine.events.Delta` ... :class:`Done`) as the typed
events every surface encodes (:data:`ReplyEvent`), whatever its wire.

It is where a reply is read back, once for every surface and the WebSocket:

- its thinking apart from its answer (``chat.engine.reasoning``: :class:`ReasoningOut`), or left in the text for a
  surface that shows it as text (the WebSocket);
- its tool calls (``chat.server.reply.tools_api``): a reply that may call tools is *held*, nothing of its answer is
  sent before it is done, then its text (:class:`TextOut`) and its calls (:class:`CallsOut`);
- the **settle** step (``reasoning_api.settle``, ``tools_api.settle``): once a reply that thought or called tools is
  done, the history as the next request renders it is computed in the background, so that request finds it in the
  cache. Every surface's reply goes through it here, and nowhere else;
- the prompt's usage before the first token, when the surface asks (:class:`Prefilled`);
- its end, with usage and timings (:class:`Finished`), or its failure (:class:`Failed`: the turn failed while
  generating, or the client read too slowly).

:func:`open_replies` runs a request's turns (``chat.server.reply.choices``, which paces them to a slow client and
cuts a client that does not read: ``slow_client``) and yields their reply events, one list per engine batch (a
stream writes each list at once); :func:`whole_replies` waits for every turn's :class:`Finished` (a reply sent
whole). The WebSocket feeds its turns' events to a :class:`ReplyReader` itself (they come by callback).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from chat.engine.events import Delta, Done, PrefillPlanned, TurnRequest, Usage
from chat.engine.reasoning import Markers, ReasoningSplitter
from chat.engine.sampling import TokenLogprob
from chat.engine.tool_calls import ToolCall
from chat.server.errors import SlowClientError
from chat.server.reply import reasoning_api, tools_api
from chat.server.reply.choices import run_turn_batches, run_turns
from chat.server.reply.tools_api import ToolPlan


@dataclass(frozen=True, slots=True)
class TextOut:
    """Text of the reply's answer (its thinking apart, unless the reader leaves it in)."""

    text: str
    token_ids: tuple[int, ...] = ()  # the tokens it covers (all of the reply's, for a held reply's text)
    logprobs: tuple[TokenLogprob, ...] = ()  # theirs, when the request asked for log-probabilities


@dataclass(frozen=True, slots=True)
class ReasoningOut:
    """Text of the reply's thinking."""

    text: str


@dataclass(frozen=True, slots=True)
class CallsOut:
    """The calls of a finished reply, whole (each surface gives them its own ids)."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a reply."""

    done: Done  # the engine's (usage, timings, the raw text and tokens)
    content: str | None  # the answer besides its calls (None: a reply that is only calls); the thinking in front
    # when the reader leaves it in the text
    reasoning: str | None  # the thinking, when the model thought (None: it did not, or the reader leaves it in)
    calls: tuple[ToolCall, ...]  # the calls it made
    finish: str  # "stop" | "length" | "tool_calls" | "cancelled"


@dataclass(frozen=True, slots=True)
class Failed:
    """A reply that failed: ``done`` is the turn's when it failed while generating (the server logs ``error``); None
    when the client read too slowly (``error`` is then the SlowClientError, safe to show)."""

    error: BaseException
    done: Done | None = None


@dataclass(frozen=True, slots=True)
class Prefilled:
    """The prompt's usage, known before the first token (the prompt looked up, its prefill begun: prompt and cached
    tokens as the end will say): only for a turn whose request has ``report_prefill`` (Anthropic's message_start)."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class Waiting:
    """Nothing came for ``keepalive_s`` before the first token (a long prefill, a queue): a surface may send its
    keep-alive (Anthropic's ``ping``)."""


ReplyEvent = TextOut | ReasoningOut | CallsOut | Finished | Failed | Waiting | Prefilled


class ReplyReader:
    """How one turn's reply is read back (see the module docstring)."""

    def __init__(
        self,
        request: TurnRequest,
        plan: ToolPlan | None,
        markers: Markers | None,
        *,
        engine=None,
        split_thinking: bool = True,
    ) -> None:
        self.request = request  # what the engine was asked (settle renders the next prompt from it)
        self.plan = plan  # the turn's tools (None: the surface offers none)
        self.markers = markers  # the thinking markers, when the model thinks
        self.engine = engine  # where the settle step runs (None: this reply is not settled)
        self.split_thinking = split_thinking  # False: the thinking stays in the text (the WebSocket shows it so)
        self.held = plan is not None and plan.calls_possible  # nothing of the answer is sent before it is done
        self.splitter = ReasoningSplitter(markers) if markers is not None and split_thinking else None

    def delta(self, event: Delta) -> list[ReplyEvent]:
        """The events of one engine delta."""
        out: list[ReplyEvent] = []
        text = event.text
        if self.splitter is not None:
            thought, text = self.splitter.push(event.text)
            if thought:
                out.append(ReasoningOut(thought))
        if not self.held and (text or event.logprobs):
            out.append(TextOut(text, event.token_ids, event.logprobs))
        return out

    def done(self, done: Done) -> list[ReplyEvent]:
        """The events that end the reply. The settle step runs first: a client's next request comes after them."""
        if self.engine is not None:
            self.settle(self.engine, done)
        if done.finish_reason == "error":
            return [Failed(done.error or RuntimeError("generation failed"), done)]
        out: list[ReplyEvent] = []
        if self.splitter is not None:
            thought, text = self.splitter.flush()
            if thought:
                out.append(ReasoningOut(thought))
            if text and not self.held:
                out.append(TextOut(text))
        reasoning, answer = self.markers.split(done.text) if self.markers is not None else (None, done.text)
        parsed, finish = tools_api.read_reply(self.plan, replace(done, text=answer))
        content = parsed.content
        if not self.split_thinking:  # the thinking stays in front of the answer, as the text showed it
            content = done.text[: len(done.text) - len(answer)] + (parsed.content or "")
            reasoning = None
        if self.held:
            if content or done.logprobs:
                out.append(TextOut(content or "", done.token_ids, done.logprobs))
            if parsed.calls:
                out.append(CallsOut(tuple(parsed.calls)))
        finish = "cancelled" if done.finish_reason == "cancelled" else finish
        out.append(Finished(done, content, reasoning, tuple(parsed.calls), finish))
        return out

    def settle(self, engine, done: Done) -> None:
        """Compute the next prompt's history ahead when the reply thought or the template re-renders its calls (see
        ``reasoning_api.settle``, ``tools_api.settle``)."""
        reasoning_api.settle(engine, self.request, self.markers, self.held, done)
        tools_api.settle(engine, self.request, self.plan, self.markers, done)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request of any surface as the one thing the pipeline runs: its turns (``n`` replies, or one per prompt),
    how their replies are read back, and the request field their grammar comes from (named when it does not
    compile). Each surface's converter builds one."""

    turns: Sequence[TurnRequest]
    plan: ToolPlan | None = None  # the tools offered (the same for every turn)
    markers: Markers | None = None  # the thinking markers (None: no thinking to read apart)
    grammar_field: str = "response_format"

    def readers(self, engine) -> list[ReplyReader]:
        """One reader per turn; the first one's reply is settled (the client continues the conversation with it)."""
        return [
            ReplyReader(turn, self.plan, self.markers, engine=engine if i == 0 else None)
            for i, turn in enumerate(self.turns)
        ]


async def open_replies(
    engine, prepared: Prepared, *, max_pending: int | None = None, keepalive_s: float | None = None
) -> AsyncIterator[list[tuple[int, ReplyEvent]]]:
    """Run ``prepared``'s turns; their reply events as ``(turn index, event)``, one list per engine batch. The first
    batch is awaited before this returns: a turn refused before computing anything (a prompt over the context, say)
    is then an HTTP error, not a broken stream. With ``keepalive_s``, it is awaited that long at most: the stream
    then starts, and ``(-1, Waiting())`` comes every ``keepalive_s`` until a reply event other than :class:`Prefilled`
    arrives (a long prefill goes on after its first chunk; an error that comes meanwhile is raised by the
    iterator). A client that leaves ``max_pending`` events unread ends the replies with
    ``Failed(SlowClientError)`` (index -1). Close the iterator to cancel the turns still running.

    Raises:
        whatever the turns raise before computing anything (within ``keepalive_s``).
    """
    batches = run_turn_batches(engine, prepared.turns, max_pending=max_pending)
    first = asyncio.ensure_future(anext(batches))
    try:
        await asyncio.wait([first], timeout=keepalive_s)
        if first.done():
            first.result()  # raises what the turns raised
    except BaseException:
        await _stop(first, batches)
        raise
    return _read(batches, first, prepared.readers(engine), keepalive_s)


async def _read(batches, first: asyncio.Future, readers: list[ReplyReader], keepalive_s: float | None):
    waiting = keepalive_s is not None  # Waiting events go out until the first event other than Prefilled
    current = first  # the batch awaited, as a future while Waiting events may have to go out
    try:
        while True:
            while not current.done():
                await asyncio.wait([current], timeout=keepalive_s)
                if not current.done():
                    yield [(-1, Waiting())]
            try:
                pending = current.result()
            except StopAsyncIteration:
                return
            except SlowClientError as exc:
                yield [(-1, Failed(exc))]
                return
            while True:
                out: list[tuple[int, ReplyEvent]] = []
                for i, event in pending:
                    reader = readers[i]
                    if isinstance(event, Delta):
                        out.extend((i, e) for e in reader.delta(event))
                    elif isinstance(event, PrefillPlanned):
                        out.append((i, Prefilled(event.usage)))
                    else:
                        out.extend((i, e) for e in reader.done(event))
                if waiting and any(not isinstance(e, Prefilled) for _, e in out):
                    waiting = False
                if out:
                    yield out
                if waiting:  # a prefill runs on: await the next batch as a future, to send Waiting meanwhile
                    current = asyncio.ensure_future(anext(batches))
                    break
                try:
                    pending = await anext(batches)
                except StopAsyncIteration:
                    return
                except SlowClientError as exc:
                    yield [(-1, Failed(exc))]
                    return
    finally:
        await _stop(current, batches)


async def _stop(first: asyncio.Future, batches) -> None:
    """Cancel the wait for the first batch (if still waiting), then close the turns' events (cancels the turns)."""
    if not first.done():
        first.cancel()
        with contextlib.suppress(BaseException):
            await first
    await batches.aclose()


async def whole_replies(engine, prepared: Prepared) -> list[Finished]:
    """Every turn's :class:`Finished`, in turn order, once all are done (a reply sent whole).

    Raises:
        whatever a turn raised before computing anything; a turn's error when it failed while generating.
    """
    readers = prepared.readers(engine)
    finished: dict[int, Finished] = {}
    events = run_turns(engine, prepared.turns)
    async with contextlib.aclosing(events):
        async for i, event in events:
            if not isinstance(event, Done):
                continue  # the reply is read whole at its end
            for out in readers[i].done(event):
                if isinstance(out, Failed):
                    raise out.error
                if isinstance(out, Finished):
                    finished[i] = out
    return [finished[i] for i in range(len(prepared.turns))]
