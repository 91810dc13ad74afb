"""Several turns of one request (``chat/server/reply/choices.py``): their events merged as they arrive, in batches,
and their log-probabilities in OpenAI's wire shapes. (The seeds of ``n`` replies, ``with_seeds``: in
tests/chat/engine/test_constraints.py; a stream cut for a slow client: transport/test_backpressure.py.)"""

from __future__ import annotations

import asyncio
import math
import threading

from chat.engine.events import Delta
from chat.engine.sampling import TokenLogprob
from chat.server.reply.choices import FLOOR, chat_logprobs, completion_logprobs, run_turn_batches, run_turns


class _Steps:
    """An engine whose turn delivers one delta, then (once the consumer took it) four at once, as one step of a
    4-turn batch would; the consumer is still busy when they come."""

    def __init__(self) -> None:
        self.taken, self.sent = threading.Event(), threading.Event()

    def submit(self, request, sink):
        def deliver() -> None:
            sink(Delta("t0", (0,)))
            self.taken.wait(10)
            for k in range(1, 5):
                sink(Delta(f"t{k}", (k,)))
            self.sent.set()

        threading.Thread(target=deliver).start()
        return self

    def cancel(self) -> None:
        pass


def test_events_that_arrive_while_the_consumer_is_busy_come_as_one_batch():
    engine = _Steps()

    async def two_batches():
        batches = run_turn_batches(engine, [object()])
        try:
            first = await anext(batches)
            engine.taken.set()
            assert engine.sent.wait(10)  # the loop is busy (blocked here) while the four arrive
            return first, await anext(batches)
        finally:
            await batches.aclose()

    first, second = asyncio.run(two_batches())
    assert [e.text for _, e in first] == ["t0"]
    assert [e.text for _, e in second] == ["t1", "t2", "t3", "t4"]


class _Turns:
    """An engine whose turns each deliver their deltas then a Done-like end, from threads, interleaved."""

    def __init__(self) -> None:
        self.cancelled = 0

    def submit(self, request, sink):
        from chat.engine.events import Done, Timings, Usage

        def deliver() -> None:
            for k in range(3):
                sink(Delta(f"{request}{k}", (k,)))
            sink(Done(f"{request}", (0, 1, 2), "stop", Usage(1, 0, 3), Timings(1.0, 1.0, 1.0, 1.0)))

        threading.Thread(target=deliver).start()
        return self

    def cancel(self) -> None:
        self.cancelled += 1


def test_run_turns_yields_every_turns_events_by_index_and_ends_after_the_last_done():
    engine = _Turns()

    async def collect():
        return [item async for item in run_turns(engine, ["a", "b"])]

    seen = asyncio.run(collect())
    for index, name in enumerate("ab"):
        mine = [type(e).__name__ + ":" + e.text for i, e in seen if i == index]
        assert mine == [f"Delta:{name}0", f"Delta:{name}1", f"Delta:{name}2", f"Done:{name}"]  # in order
    assert engine.cancelled == 2  # each handle let go at the end (a turn that is done ignores it)


class _Runtime:
    """Tokens 0..9 are the letters a..j; token 10 is the first byte of "é" (a character cut in two)."""

    def token_bytes(self, token: int) -> bytes:
        return "é".encode()[:1] if token == 10 else bytes([ord("a") + token])


def test_chat_logprobs_are_openais_content_entries_with_finite_values():
    runtime = _Runtime()
    out = chat_logprobs(runtime, [TokenLogprob(0, -0.5, ((0, -0.5), (1, -math.inf))), TokenLogprob(10, -2.0)])
    assert out == [
        {
            "token": "a",
            "logprob": -0.5,
            "bytes": [97],
            "top_logprobs": [
                {"token": "a", "logprob": -0.5, "bytes": [97]},
                {"token": "b", "logprob": FLOOR, "bytes": [98]},  # -inf is not JSON: OpenAI's floor
            ],
        },
        {"token": "\ufffd", "logprob": -2.0, "bytes": [0xC3], "top_logprobs": []},  # half a character: U+FFFD
    ]


def test_chat_logprobs_decode_a_token_where_the_runtime_has_no_token_bytes():
    class Decoding:
        def decode(self, tokens):
            return "".join(chr(ord("a") + t) for t in tokens)

    (entry,) = chat_logprobs(Decoding(), [TokenLogprob(2, -1.0)])
    assert (entry["token"], entry["bytes"]) == ("c", [99])


def test_completion_logprobs_give_tokens_offsets_and_each_positions_alternatives():
    runtime = _Runtime()
    logprobs = [None, TokenLogprob(1, -0.25, ((2, -0.1),)), TokenLogprob(2, -math.inf, ((2, -math.inf),))]
    out = completion_logprobs(runtime, logprobs, [0, 1, 2], offset=5)
    assert out == {
        "tokens": ["a", "b", "c"],
        "token_logprobs": [None, -0.25, FLOOR],  # the first of an echoed prompt has none
        "top_logprobs": [None, {"c": -0.1, "b": -0.25}, {"c": FLOOR}],  # the token itself added when not among them
        "text_offset": [5, 6, 7],
    }
