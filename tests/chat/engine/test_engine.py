"""The engine's worker thread: streaming, interleaving, cancellation, errors reach only their caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cache import PrefixCache
from chat.engine.engine import Engine
from chat.engine.errors import ContextOverflowError, EngineClosedError
from chat.engine.events import Delta, Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from tests.chat.engine.fakes import FakeRuntime


@pytest.fixture
def engine():
    rt = FakeRuntime(script=lambda p: "long " * 40 if b"long" in bytes(t for t in p if t < 256) else "short")
    rt.delay_s = 0.002  # the long reply takes ~0.4 s; the short one a few steps
    eng = Engine(rt, cache=PrefixCache())
    yield eng
    eng.close()


def ask(text: str, **params) -> TurnRequest:
    return TurnRequest([{"role": "user", "content": text}], SamplingParams(**params))


async def collect(engine: Engine, request: TurnRequest) -> tuple[list[Delta], Done]:
    deltas = []
    async for event in engine.generate(request):
        if isinstance(event, Done):
            return deltas, event
        deltas.append(event)
    raise AssertionError("no Done")


def test_generate_streams_deltas_then_done(engine):
    deltas, done = asyncio.run(collect(engine, ask("hi")))
    assert done.text == "short" and "".join(d.text for d in deltas) == "short"
    assert engine.metrics.turns == 1 and engine.metrics.active == 0


def test_a_short_turn_finishes_while_a_long_reply_is_still_streaming(engine):
    async def scenario():
        order = []

        async def run(text):
            _, done = await collect(engine, ask(text))
            order.append(text)
            return done

        long_task = asyncio.create_task(run("long please"))
        await asyncio.sleep(0.01)
        short = await run("quick")
        assert not long_task.done()  # the long reply is still going when the short one is done
        long = await long_task
        return order, short, long

    order, short, long = asyncio.run(scenario())
    assert order == ["quick", "long please"]
    assert short.finish_reason == long.finish_reason == "stop"


def test_a_consumer_that_goes_away_cancels_its_generation(engine):
    async def scenario():
        agen = engine.generate(ask("long please"))
        async for event in agen:
            if isinstance(event, Delta) and event.text:
                break
        await agen.aclose()  # what a vanished WebSocket client does
        for _ in range(200):
            if engine.metrics.active == 0:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert engine.metrics.active == 0 and engine.metrics.finish_reasons == {"cancelled": 1}
    stats = engine.cache_stats()
    assert stats.in_use == 0 and stats.entries == 1


def test_the_handle_given_at_start_cancels_the_stream_from_elsewhere(engine):
    async def scenario():
        handles = []
        events = []
        async for event in engine.generate(ask("long please"), on_start=handles.append):
            events.append(event)
            if isinstance(event, Delta) and event.text:
                handles[0].cancel()  # e.g. a cancel that reached a cluster replica by call id
        return handles, events[-1]

    handles, done = asyncio.run(scenario())
    assert len(handles) == 1 and isinstance(done, Done) and done.finish_reason == "cancelled"


def test_errors_reach_only_their_caller(engine):
    engine.runtime.context_window = 20

    async def scenario():
        with pytest.raises(ContextOverflowError):
            await collect(engine, ask("x" * 50))
        return await collect(engine, ask("ok"))

    _, done = asyncio.run(scenario())
    assert done.text == "short"


def test_a_closed_engine_refuses_new_turns():
    engine = Engine(FakeRuntime(), cache=None)
    engine.close()
    with pytest.raises(EngineClosedError):
        engine.submit(ask("x"), lambda e: None)


def test_load_builds_the_model_in_the_worker_thread_which_alone_gets_the_threads():
    import threading

    import torch

    seen = {}

    def loader():
        seen["thread"] = threading.current_thread().name
        seen["torch_threads"] = torch.get_num_threads()
        return FakeRuntime()

    caller_threads = torch.get_num_threads()
    engine = Engine.load(loader, cache=PrefixCache(), threads=2)
    try:
        assert seen == {"thread": "turncache-engine", "torch_threads": 2}
        assert torch.get_num_threads() == caller_threads  # the caller's own setting is not touched
        _, done = asyncio.run(collect(engine, ask("hi")))
        assert done.finish_reason == "stop" and engine.runtime.name == "fake"
    finally:
        engine.close()


def test_a_failed_load_is_raised_to_the_caller():
    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        Engine.load(broken, cache=None)


def test_a_better_turn_submitted_during_a_step_stops_it_and_every_reply_is_its_own():
    """The batch turn's first step is in flight (held at the fake's gate) when a chat turn of better priority is
    submitted: the step stops at its next layer, the chat turn goes first, and both replies are what they are
    alone."""

    def script(prompt) -> str:
        return "chat reply" if b"chat" in bytes(t for t in prompt if t < 256) else "batch " * 5

    rt = FakeRuntime(script=script)
    rt.gate = threading.Event()
    engine = Engine(rt, cache=PrefixCache())
    try:
        finished: dict[str, list] = {"batch": [], "chat": []}
        ended = threading.Semaphore(0)

        def sink(name):
            def take(event):  # on the engine's worker thread
                finished[name].append(event)
                if isinstance(event, Done | BaseException):
                    ended.release()

            return take

        engine.submit(ask("a batch question", priority=5), sink("batch"))
        assert rt.entered.wait(10)  # its first forward is in flight, waiting at the gate
        engine.submit(ask("a chat question", priority=0), sink("chat"))
        rt.gate.set()
        assert ended.acquire(timeout=10) and ended.acquire(timeout=10)
        assert rt.interrupted == 1 and engine.metrics.steps_interrupted == 1
        for name, events in finished.items():
            request = ask(f"a {name} question", priority=5 if name == "batch" else 0)
            alone = run_to_end(Turn(FakeRuntime(script=script), None, request))[1]
            assert isinstance(events[-1], Done) and events[-1].token_ids == alone.token_ids, name
    finally:
        engine.close()


def test_the_worker_tells_the_cache_when_it_computes_so_that_disk_writes_wait_behind_its_turns():
    calls: list[bool] = []

    class Recording(PrefixCache):
        def defer_disk_writes(self, busy: bool) -> None:
            calls.append(busy)

    eng = Engine(FakeRuntime(), cache=Recording())
    try:
        pause = threading.Event()  # never set: a sleep
        for _ in range(500):
            if calls:
                break
            pause.wait(0.01)
        assert calls == [False]  # the worker waits for work: idle
        _, done = asyncio.run(collect(eng, ask("hi")))
        for _ in range(500):
            if len(calls) == 3:
                break
            pause.wait(0.01)  # the worker goes back to waiting
        assert done.finish_reason in ("stop", "length") and calls == [False, True, False]  # told once per change
    finally:
        eng.close()


def test_a_turn_that_asks_reports_its_prompts_usage_once_before_its_first_token(engine):
    """``report_prefill``: a PrefillPlanned once the prompt is looked up and its prefill begun, before any Delta, its
    prompt and cached tokens as the Done says them; without it, none (every other consumer sees Delta ... Done)."""
    from dataclasses import replace

    from chat.engine.events import PrefillPlanned

    async def events(request: TurnRequest) -> list:
        return [event async for event in engine.generate(request)]

    plain = ask("short reply please " * 30)
    asked = replace(plain, report_prefill=True)
    for request in (asked, asked):  # cold, then from the cache
        got = asyncio.run(events(request))
        planned = [i for i, e in enumerate(got) if isinstance(e, PrefillPlanned)]
        assert planned == [0] and isinstance(got[1], Delta) and isinstance(got[-1], Done)
        done = got[-1]
        assert got[0].usage == replace(done.usage, completion_tokens=0)
    assert got[0].usage.cached_tokens > 0  # the second read its prompt from the cache
    assert not any(isinstance(e, PrefillPlanned) for e in asyncio.run(events(plain)))
