"""The sans-I/O limiter against a reference that keeps every event and sums by brute force: random clocks, amounts and
limits; every decision and every Retry-After agree, waiting Retry-After is enough, and no window of a minute ever
admits more requests than the limit."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.server.tenancy.ratelimit import (
    CONCURRENCY_RETRY_S,
    WINDOW_S,
    Limits,
    RateLimiter,
    Refusal,
    SlidingWindow,
)

# times are multiples of 1/64 s: exact in binary floating point, so the limiter and the reference compare exactly
ticks = st.integers(min_value=0, max_value=64 * 90).map(lambda n: n / 64)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Reference:
    """Everything that happened, summed again at every question."""

    requests: list[float] = field(default_factory=list)  # times of admitted requests
    tokens: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens) charged
    active: int = 0

    def in_window(self, now: float, events: list[tuple[float, int]]) -> list[tuple[float, int]]:
        return [(t, a) for t, a in events if now - t < WINDOW_S]

    def wait(self, now: float, events: list[tuple[float, int]], limit: int) -> float:
        """The least wait after which the window holds less than ``limit``: try every moment an event expires."""
        live = self.in_window(now, events)
        if sum(a for _, a in live) < limit:
            return 0.0
        return min(t + WINDOW_S - now for t, _ in live if sum(a for u, a in live if u > t) < limit)

    def check(self, now: float, limits: Limits, turns: int) -> Refusal | None:
        if limits.concurrent_turns is not None and self.active + turns > limits.concurrent_turns:
            return Refusal("concurrent_turns", limits.concurrent_turns, CONCURRENCY_RETRY_S)
        requests = [(t, 1) for t in self.requests]
        rpm = limits.requests_per_minute
        if rpm is not None and sum(a for _, a in self.in_window(now, requests)) >= rpm:
            return Refusal("requests_per_minute", rpm, self.wait(now, requests, rpm))
        tpm = limits.tokens_per_minute
        if tpm is not None and sum(a for _, a in self.in_window(now, self.tokens)) >= tpm:
            return Refusal("tokens_per_minute", tpm, self.wait(now, self.tokens, tpm))
        return None


limits_st = st.builds(
    Limits,
    concurrent_turns=st.none() | st.integers(1, 4),
    requests_per_minute=st.none() | st.integers(1, 6),
    tokens_per_minute=st.none() | st.integers(1, 300),
)
operation = st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 3)),
    st.tuples(st.just("end"), st.just(0)),
    st.tuples(st.just("charge"), st.integers(0, 200)),
)


@settings(max_examples=300, deadline=None)
@given(limits=limits_st, steps=st.lists(st.tuples(ticks, operation), max_size=60))
def test_the_limiter_decides_as_the_reference(limits, steps):
    clock, ref = Clock(), Reference()
    limiter = RateLimiter(clock)
    for dt, (op, amount) in steps:
        clock.now += dt
        if op == "admit":
            want = ref.check(clock.now, limits, amount)
            got = limiter.admit("t", limits, amount)
            assert got == want, (clock.now, got, want)
            if got is None:
                ref.requests.append(clock.now)
                for _ in range(amount):
                    limiter.start_turn("t")
                ref.active += amount
        elif op == "end":
            limiter.end_turn("t")
            ref.active = max(0, ref.active - 1)
        else:
            limiter.charge("t", amount)
            ref.tokens.append((clock.now, amount))
        assert limiter.active("t") == ref.active


@settings(max_examples=300, deadline=None)
@given(rpm=st.integers(1, 5), gaps=st.lists(ticks, min_size=1, max_size=40))
def test_no_minute_admits_more_requests_than_the_limit_and_retry_after_is_exact(rpm, gaps):
    clock = Clock()
    limiter, limits = RateLimiter(clock), Limits(requests_per_minute=rpm)
    admitted: list[float] = []
    for gap in gaps:
        clock.now += gap
        refusal = limiter.admit("t", limits)
        if refusal is None:
            admitted.append(clock.now)
            continue
        assert refusal.limit == "requests_per_minute" and refusal.retry_after_s > 0
        waited = clock.now
        clock.now = waited + refusal.retry_after_s - 1 / 64  # a tick earlier: still refused
        assert limiter.check("t", limits) is not None
        clock.now = waited + refusal.retry_after_s  # exactly Retry-After later: admitted
        assert limiter.admit("t", limits) is None
        admitted.append(clock.now)
    for start in admitted:  # every window of a minute that starts at an admission
        assert sum(1 for t in admitted if start <= t < start + WINDOW_S) <= rpm


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(st.tuples(ticks, st.integers(0, 50)), max_size=40), limit=st.integers(1, 200))
def test_a_sliding_window_sums_exactly_the_last_minute(entries, limit):
    window, now, seen = SlidingWindow(), 0.0, []
    for dt, amount in entries:
        now += dt
        window.add(now, amount)
        seen.append((now, amount))
        assert window.used(now) == sum(a for t, a in seen if now - t < WINDOW_S)
        wait = window.wait_below(now, limit)
        assert copy.deepcopy(window).used(now + wait) < limit  # waiting that long is enough ...
        if wait > 0:  # ... and a tick less is not
            assert copy.deepcopy(window).used(now + wait - 1 / 64) >= limit


def test_tenants_do_not_share_limits_and_a_refusal_records_nothing():
    clock = Clock()
    limiter, limits = RateLimiter(clock), Limits(requests_per_minute=2, concurrent_turns=1)
    assert limiter.admit("a", limits) is None
    limiter.start_turn("a")
    refused = limiter.admit("a", limits)
    assert refused == Refusal("concurrent_turns", 1, CONCURRENCY_RETRY_S)
    assert limiter.admit("b", limits) is None  # another tenant: its own counts
    limiter.end_turn("a")
    assert limiter.admit("a", limits) is None  # the refused request was not counted: 2 admitted, not 3
    limiter.start_turn("a")
    limiter.end_turn("a")
    assert limiter.admit("a", limits).limit == "requests_per_minute"


def test_tokens_are_charged_when_turns_end_and_one_reply_may_overshoot():
    clock = Clock()
    limiter, limits = RateLimiter(clock), Limits(tokens_per_minute=100)
    assert limiter.admit("t", limits) is None
    clock.now = 10.0
    limiter.charge("t", 250)  # one long reply: over the limit, admitted before it was known
    refusal = limiter.admit("t", limits)
    assert refusal is not None and refusal.limit == "tokens_per_minute"
    assert refusal.retry_after_s == 60.0 and refusal.retry_after == 60  # until those tokens are a minute old
    assert "tokens per minute is 100" in refusal.message
    clock.now = 70.0
    assert limiter.admit("t", limits) is None


def test_a_tenants_values_lie_over_the_server_defaults():
    defaults = Limits(concurrent_turns=4, requests_per_minute=60)
    assert Limits(requests_per_minute=5).over(defaults) == Limits(concurrent_turns=4, requests_per_minute=5)


def test_retry_after_counts_from_the_answer_taking_off_the_time_it_was_held():
    fresh = Refusal("requests_per_minute", 10, 5.3)
    assert fresh.retry_after == 6 and Refusal("requests_per_minute", 10, 0.2).retry_after == 1
    held = Refusal("requests_per_minute", 10, 5.3, held_s=1.0)
    assert held.retry_after == 5 and "retry after 4.3 s" in held.message
    assert Refusal("concurrent_turns", 2, 1.0, held_s=1.0).retry_after == 0  # held its whole retry time: now
