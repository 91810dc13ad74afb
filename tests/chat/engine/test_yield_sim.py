"""bench tenants' workload on the real scheduler in virtual time: what yielding buys the interactive tenant and costs
the batch one, free of the machine's noise.

The model is the weightless fake; a step takes ``STEP_S + ROW_S x tokens`` of virtual time (fitted to the quiet
figures of 2026-11-26: an interactive turn alone 33 ms on the server, 0.2 s under a full 256-token step, 700
tokens/s at 32 decoding sessions; docs/benchmarks.md). Tenant A: 2 sessions of short questions (24-token replies,
0.3-0.7 s between a reply and the next question), priority -10; tenant B: 8 eval turns at once, back to back (3
user messages of 160 tokens, 16-token replies, a fresh conversation after each third). Turns join at the step after
they arrive, as the engine admits them. ``python -m tests.chat.engine.test_yield_sim`` prints the table quoted in
docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import dataclass

from cache import PrefixCache
from chat.engine.events import Delta, Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.scheduler import BatchSettings, Scheduler
from chat.engine.turn import Turn
from tests.chat.engine.fakes import FakeRuntime

STEP_S = 0.014  # a forward's fixed cost (weights, per-layer overhead)
ROW_S = 0.00097  # and per token in it


@dataclass
class Outcome:
    ttft_p50_s: float  # A's first-token p50 (virtual seconds; admission and HTTP not counted)
    b_tokens_per_s: float  # B's completion tokens per virtual second
    a_step_tokens: float  # median tokens in the step that gave A's first token


def simulate(settings: BatchSettings, *, with_b: bool, a_turns: int = 10, seed: int = 0) -> Outcome:
    """A's ``a_turns`` turns per session (alone, or beside B's load) under ``settings``."""
    rng = random.Random(seed)
    rt, cache, now = FakeRuntime(script=lambda prompt: "y" * 300), PrefixCache(), [0.0]
    scheduler = Scheduler(rt, settings, clock=lambda: now[0])
    arrivals: list[tuple[float, str, tuple]] = []  # (when, tenant, what to continue with)
    a_history = {s: [{"role": "system", "content": f"[A {s}] " + "h" * 110}] for s in range(2)}
    conversations = itertools.count()

    def ask_a(session: int, turn: int, at: float) -> None:
        a_history[session].append({"role": "user", "content": f"question {session}.{turn} " + "q" * 6})
        request = TurnRequest(list(a_history[session]), SamplingParams(max_tokens=24, priority=-10), salt=b"A")
        arrivals.append((at, "A", (session, turn, request)))

    def ask_b(at: float, messages: list | None = None, turn: int = 0) -> None:
        if messages is None:
            messages = [{"role": "system", "content": f"[eval {next(conversations)}] " + "s" * 60}]
        messages = [*messages, {"role": "user", "content": "".join(rng.choice("abcdefgh ") for _ in range(160))}]
        request = TurnRequest(messages, SamplingParams(max_tokens=16, priority=0), salt=b"B")
        arrivals.append((at, "B", (messages, turn, request)))

    for session in range(2):
        ask_a(session, 0, 0.05 + 0.2 * session)
    for _ in range(8 if with_b else 0):
        ask_b(0.0)
    asked: dict[Turn, tuple[str, float, tuple]] = {}
    ttfts, a_steps, b_tokens, a_done = [], [], 0, 0
    while a_done < 2 * a_turns:
        arrivals.sort(key=lambda a: a[0])
        if not scheduler.busy and arrivals[0][0] > now[0]:
            now[0] = arrivals[0][0]
        while arrivals and arrivals[0][0] <= now[0]:
            at, tenant, what = arrivals.pop(0)
            turn = Turn(rt, cache, what[-1])
            turn.begin()
            scheduler.add(turn)
            asked[turn] = (tenant, at, what)
        fed = rt.forwarded
        results = scheduler.step()
        tokens = rt.forwarded - fed
        now[0] += STEP_S + ROW_S * tokens
        for turn, events in results:
            tenant, at, what = asked[turn]
            for event in events:
                if tenant == "A" and isinstance(event, Delta) and len(turn.reply.tokens) == 1:
                    ttfts.append(now[0] - at)
                    a_steps.append(tokens)
                if not isinstance(event, Done):
                    continue
                if tenant == "A":
                    session, n, _ = what
                    a_done += 1
                    a_history[session].append({"role": "assistant", "content": event.text})
                    if n + 1 < a_turns:
                        ask_a(session, n + 1, now[0] + rng.uniform(0.3, 0.7))
                else:
                    messages, n, _ = what
                    b_tokens += len(event.token_ids)
                    if n + 1 < 3:
                        ask_b(now[0], [*messages, {"role": "assistant", "content": event.text}], n + 1)
                    else:
                        ask_b(now[0])
    return Outcome(statistics.median(ttfts), b_tokens / now[0], statistics.median(a_steps))


def ratio(settings: BatchSettings, a_turns: int) -> tuple[float, Outcome]:
    alone = simulate(settings, with_b=False, a_turns=a_turns)
    loaded = simulate(settings, with_b=True, a_turns=a_turns)
    return loaded.ttft_p50_s / alone.ttft_p50_s, loaded


def test_yielding_brings_the_interactive_first_token_near_its_time_alone_and_costs_the_batch_tenant_a_share():
    off, off_load = ratio(BatchSettings(yield_budget=0), a_turns=8)
    on, on_load = ratio(BatchSettings(), a_turns=8)
    assert off > 2.0 and on < 1.5  # the workload's ratio without yielding (3.2) and with it, by the defaults
    assert on_load.a_step_tokens < off_load.a_step_tokens  # no batch reply rides in the first-token step
    assert 0.4 < on_load.b_tokens_per_s / off_load.b_tokens_per_s < 0.9  # the price, while A is around


if __name__ == "__main__":
    print("| yield budget | hold s | A's first-token ratio | A's p50 loaded ms | B's tokens/s | B's share |")
    print("| --- | --- | --- | --- | --- | --- |")
    _, base = ratio(BatchSettings(yield_budget=0), a_turns=60)
    for budget, hold in ((0, 0.0), (16, 0.0), (16, 10.0), (24, 10.0), (32, 10.0), (64, 10.0), (128, 10.0)):
        r, loaded = ratio(BatchSettings(yield_budget=budget, yield_hold_s=hold), a_turns=60)
        share = loaded.b_tokens_per_s / base.b_tokens_per_s
        print(
            f"| {budget or 'off'} | {hold:g} | {r:.2f} | {loaded.ttft_p50_s * 1e3:.0f} | "
            f"{loaded.b_tokens_per_s:.1f} | {share:.2f} |",
            flush=True,
        )
