"""Several turns of one HTTP request (``n`` replies, or ``/v1/completions``' list of prompts) run side by side in the
engine, their events merged in arrival order, and the log-probabilities of their tokens in OpenAI's wire shapes.

``n`` replies to one prompt are ``n`` turns submitted together: the first computes the prompt and stores it, the
others wait for it and restore it from the cache (the scheduler's *prefixes shared in flight*), so the prompt is
computed once when it has at least 16 tokens (below that, each computes it: a few tokens). With a seed, reply ``i``
samples with ``seed + i`` (the replies differ, and each is reproducible alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from chat.engine.events import Done, Event, TurnRequest
from chat.engine.sampling import TokenLogprob
from chat.server.errors import SlowClientError
from chat.server.transport.backpressure import Pacer
from chat.server.transport.relay import relay_for


def with_seeds(request: TurnRequest, n: int) -> list[TurnRequest]:
    """``n`` copies of ``request``, the ``i``-th seeded ``seed + i`` (when it has a seed)."""
    seed = request.params.seed
    if seed is None or n == 1:
        return [request] * n
    return [replace(request, params=replace(request.params, seed=(seed + i) % 2**63)) for i in range(n)]


async def run_turns(
    engine, requests: Sequence[TurnRequest], *, max_pending: int | None = None
) -> AsyncIterator[tuple[int, Event]]:
    """Every turn's events as ``(index in requests, event)``, in the order they come; ends after the last Done.
    Closing the iterator early cancels the turns still running. ``max_pending``: as :func:`run_turn_batches` (a
    stream's bound; None for a reply sent whole).

    Raises:
        whatever a turn raised before it computed anything (ContextOverflowError, GrammarError, ...): the other
        turns are then cancelled; SlowClientError (see :func:`run_turn_batches`).
    """
    batches = run_turn_batches(engine, requests, max_pending=max_pending)
    try:
        async for batch in batches:
            for item in batch:
                yield item
    finally:
        await batches.aclose()


async def run_turn_batches(
    engine, requests: Sequence[TurnRequest], *, max_pending: int | None = None
) -> AsyncIterator[list[tuple[int, Event]]]:
    """:func:`run_turns`' events, as lists of every event that arrived while the consumer was busy with the previous
    list (one engine step's tokens, or several when the consumer fell behind): a stream writes each list at once.
    The engine's events reach the loop through its :class:`~chat.server.transport.relay.LoopRelay` (one wake-up per
    batch). When :func:`~chat.server.transport.backpressure.pause_threshold` events wait unread (the consumer is stuck
    writing to a client that reads slowly or not at all), the turns are paused in the engine until the consumer takes
    them (:class:`~chat.server.transport.backpressure.Pacer`), so a slow client's turns run at the pace it reads. When
    ``max_pending`` events wait unread anyway (events on their way when the pause came), the turns are cancelled at
    once and the next batch raises SlowClientError.

    Raises:
        as :func:`run_turns`; SlowClientError (see above).
    """
    loop = asyncio.get_running_loop()
    relay = relay_for(loop)
    pending: list[tuple[int, Event | BaseException]] = []  # arrived, not yet taken (a list and one waiter: cheaper
    # per event than an asyncio.Queue, whose every put and get is several calls)
    waiter: asyncio.Future | None = None  # set while the consumer waits for an event
    handles: list = []
    overflowed = False
    pacer = Pacer(lambda: handles, max_pending) if max_pending is not None else None

    def arrive(item: tuple[int, Event | BaseException]) -> None:  # on the loop
        nonlocal overflowed
        if overflowed:
            return
        if max_pending is not None and len(pending) >= max_pending:
            overflowed = True
            for handle in handles:
                handle.cancel()
            item = (item[0], SlowClientError(f"the client left more than {max_pending} events unread"))
        pending.append(item)
        if pacer is not None:
            pacer.unread(len(pending))
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    try:
        for i, request in enumerate(requests):
            sink = lambda e, i=i: relay.call(arrive, (i, e))  # noqa: E731
            handles.append(engine.submit(request, sink))
        running = len(requests)
        while running:
            if not pending:
                waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    waiter = None
            batch = pending.copy()
            pending.clear()
            if pacer is not None:  # the client took what was written before: the turns go on while this is written
                pacer.unread(0)
            out = []
            for i, item in batch:
                if isinstance(item, BaseException):
                    if out:
                        yield out
                    raise item
                if isinstance(item, Done):
                    running -= 1
                out.append((i, item))
            yield out
    finally:
        for handle in handles:
            handle.cancel()  # a turn that is done ignores it


FLOOR = -9999.0  # what OpenAI reports for a log-probability of -inf (JSON has no infinities)


def finite(logprob: float) -> float:
    return logprob if logprob > FLOOR else FLOOR


def token_text(runtime, token_id: int) -> tuple[str, list[int]]:
    """A token as OpenAI's log-probabilities show it: its text (bytes of a character cut in two shown as U+FFFD)
    and its bytes."""
    raw = runtime.token_bytes(token_id) if hasattr(runtime, "token_bytes") else runtime.decode([token_id]).encode()
    return raw.decode("utf-8", errors="replace"), list(raw)


def _token_dict(token: str, logprob: float, raw: list[int], top: list) -> dict:
    return {"token": token, "logprob": logprob, "bytes": raw, "top_logprobs": top}


def _top_dict(token: str, logprob: float, raw: list[int]) -> dict:
    return {"token": token, "logprob": logprob, "bytes": raw}


def chat_logprobs(
    runtime,
    logprobs: Sequence[TokenLogprob],
    token: Callable[[str, float, list[int], list], Any] = _token_dict,
    top: Callable[[str, float, list[int]], Any] = _top_dict,
) -> list:
    """``choices[i].logprobs.content`` of a chat completion (or of one stream chunk): each token built by
    ``token(text, logprob, bytes, alternatives)``, each alternative by ``top(text, logprob, bytes)`` (dicts, or the
    typed surface's wire classes)."""
    out = []
    for lp in logprobs:
        text, raw = token_text(runtime, lp.token)
        alternatives = []
        for alternative, value in lp.top:
            alt_text, alt_raw = token_text(runtime, alternative)
            alternatives.append(top(alt_text, finite(value), alt_raw))
        out.append(token(text, finite(lp.logprob), raw, alternatives))
    return out


def completion_logprobs(
    runtime, logprobs: Sequence[TokenLogprob | None], tokens: Sequence[int], offset: int = 0
) -> dict[str, list]:
    """``choices[i].logprobs`` of a legacy completion: ``tokens``, ``token_logprobs`` (None where a token has none:
    the first of an echoed prompt), ``top_logprobs`` (each position's alternatives and the token itself) and
    ``text_offset`` (where each token starts in the choice's text, counting from ``offset``)."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    at = offset
    for token, lp in zip(tokens, logprobs, strict=True):
        text, _ = token_text(runtime, token)
        out["tokens"].append(text)
        out["text_offset"].append(at)
        at += len(text)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(finite(lp.logprob))
        top = {token_text(runtime, t)[0]: finite(v) for t, v in lp.top}
        top.setdefault(text, finite(lp.logprob))
        out["top_logprobs"].append(top)
    return out
