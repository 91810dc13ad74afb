"""Paused turns (the scheduler's *Paused turns*; the server pauses a turn whose client fell behind reading): a paused
decoding turn takes no seat and computes nothing, keeps its state and rank, gives the reply it gives alone once it
goes on, and still ends when cancelled; an engine whose every turn is paused runs no step until one goes on."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.engine.engine import Engine
from chat.engine.events import Delta, Done
from chat.engine.scheduler import BatchSettings, Scheduler
from chat.engine.turn import Turn, run_to_end
from chat.server.metrics_text import render_metrics
from tests.chat.engine.fakes import FakeRuntime
from tests.chat.engine.test_scheduler import CountingRuntime, begun, decoding_turns, request

LONG = lambda prompt: "v" * 120  # noqa: E731  (replies long enough to stay decoding)


def test_a_paused_turn_takes_no_seat_and_goes_on_first_with_the_reply_it_gives_alone():
    rt = CountingRuntime(script=LONG)
    scheduler = Scheduler(rt, BatchSettings(max_batch=3, token_budget=64))
    turns = decoding_turns(rt, scheduler, 4, max_tokens=40)  # 4 decoding, 3 seats
    paused = turns[0]
    paused.pause()
    tokens, run = len(paused.reply.tokens), id(paused._run)
    for _ in range(5):
        scheduler.step()
        assert run not in rt.runs_per_step[-1] and len(rt.steps[-1]) == 3  # the three others have every seat
    assert len(paused.reply.tokens) == tokens and not paused.done
    paused.pause(False)
    scheduler.step()
    assert run in rt.runs_per_step[-1]  # it kept its rank: seated first
    events = []
    while scheduler.busy:
        events += [e for t, es in scheduler.step() if t is paused for e in es]
    done = next(e for e in events if isinstance(e, Done))
    want = run_to_end(Turn(FakeRuntime(script=LONG), None, paused.request))[1]
    assert (done.token_ids, done.finish_reason) == (want.token_ids, "length")


def test_while_only_paused_turns_are_active_no_step_would_do_anything_and_a_cancel_still_ends_one():
    rt = CountingRuntime(script=LONG)
    scheduler = Scheduler(rt)
    turns = decoding_turns(rt, scheduler, 2, max_tokens=40)
    assert scheduler.ready
    for turn in turns:
        turn.pause()
    assert scheduler.busy and not scheduler.ready
    steps = len(rt.steps)
    assert scheduler.step() == [] and len(rt.steps) == steps  # nothing planned, no forward
    turns[1].cancel()
    assert scheduler.ready
    ended = dict(scheduler.step())
    assert isinstance(ended[turns[1]][-1], Done) and ended[turns[1]][-1].finish_reason == "cancelled"
    assert not scheduler.ready and scheduler.active == 1


def test_a_prompt_is_computed_while_its_turn_is_paused_and_the_turn_stops_at_its_first_token():
    rt = CountingRuntime(script=LONG)
    scheduler = Scheduler(rt)
    turn = begun(rt, None, request("p" * 40, max_tokens=20))
    turn.pause()
    scheduler.add(turn)
    assert scheduler.ready  # a prefill is work, paused or not
    out = []
    for _ in range(10):
        out += [e for _, es in scheduler.step() for e in es]
    assert turn.decoding and len(turn.reply.tokens) == 1 and sum(isinstance(e, Delta) for e in out) <= 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(0, 5)), min_size=1, max_size=40), st.integers(1, 6))
def test_whatever_is_paused_each_step_no_paused_turn_is_fed_and_every_reply_is_its_own(pauses, max_batch):
    """Reference: a turn paused at a step is not in that step's forward; every reply equals the turn's reply alone."""
    rt = CountingRuntime(script=lambda prompt: "u" * (5 + sum(prompt) % 17))
    scheduler = Scheduler(rt, BatchSettings(max_batch=max_batch, token_budget=32))
    turns = [begun(rt, None, request(f"q{i}" * (i + 1), max_tokens=12)) for i in range(6)]
    for turn in turns:
        scheduler.add(turn)
    done: dict[int, Done] = {}
    for step in range(2000):
        if not scheduler.busy:
            break
        paused_now = pauses[step] if step < len(pauses) else set()  # then nothing is paused: all finish
        for i, turn in enumerate(turns):
            turn.pause(i in paused_now)
        runs = {id(t._run): i for i, t in enumerate(turns) if t._run is not None}
        decoding = {i for i, t in enumerate(turns) if t.decoding}
        before = len(rt.runs_per_step)
        for turn, events in scheduler.step():
            done.update({turns.index(turn): e for e in events if isinstance(e, Done)})
        if len(rt.runs_per_step) > before:
            fed = {runs[r] for r in rt.runs_per_step[-1] if r in runs}
            assert not fed & paused_now & decoding
    assert len(done) == 6
    for i, turn in enumerate(turns):
        want = run_to_end(Turn(FakeRuntime(script=rt.script), None, turn.request))[1]
        assert done[i].token_ids == want.token_ids


def _engine_turn(engine: Engine, text: str, max_tokens: int):
    events, finished = [], threading.Event()

    def sink(event) -> None:
        events.append(event)
        if isinstance(event, Done | BaseException):
            finished.set()

    return engine.submit(request(text, max_tokens=max_tokens), sink), events, finished


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_an_engine_whose_turns_are_all_paused_runs_no_step_and_a_resume_or_cancel_wakes_it():
    rt = FakeRuntime(script=LONG, delay_s=0.002)
    engine = Engine(rt, cache=None)
    calls = [0]  # scheduler steps the worker ran (a worker spinning over paused turns runs empty ones)
    step = engine.scheduler.step

    def counted():
        calls[0] += 1
        return step()

    engine.scheduler.step = counted
    try:
        first, first_events, first_done = _engine_turn(engine, "one", 100)
        second, _, second_done = _engine_turn(engine, "two", 100)
        _wait(lambda: len(first_events) >= 3)
        first.pause()
        second.pause()
        time.sleep(0.05)  # a step in flight ends
        steps = calls[0]
        time.sleep(0.2)
        assert calls[0] == steps and not first_done.is_set()  # no step while every turn is paused
        first.pause()  # already paused: not counted again
        assert engine.metrics.turn_pauses == 2
        assert "turncache_turn_pauses_total 2" in render_metrics(engine.metrics, None).splitlines()
        second.cancel()
        assert second_done.wait(2)  # the cancel woke the worker
        first.resume()
        assert first_done.wait(5)
        done = first_events[-1]
        want = run_to_end(Turn(FakeRuntime(script=LONG), None, first.turn.request))[1]
        assert isinstance(done, Done) and done.token_ids == want.token_ids
    finally:
        engine.close()
