"""Per-tenant rate limits and quotas, sans I/O: the server asks, the limiter answers with a :class:`Refusal` (which
limit, and how long to wait) or admits and records; the time comes from an injected clock, nothing here sleeps,
locks or touches the network.

The limits of one tenant (:class:`Limits`, ``None``: no limit)::

    concurrent_turns      turns running at once (a request of n choices over p prompts holds n x p)
    requests_per_minute   requests admitted in the last 60 s (one HTTP generation request, one WebSocket turn)
    tokens_per_minute     prompt + completion tokens of turns that ended in the last 60 s

Requests and tokens are counted in sliding windows (:class:`SlidingWindow`: exact sums of what happened in the
last ``WINDOW_S`` seconds, no buckets). Tokens are known only when a turn ends, so they are charged then
(:meth:`RateLimiter.charge`): a request is admitted while the window holds fewer tokens than the limit, and one
long reply may overshoot it; the tenant then waits until enough of its tokens are older than a minute. A refused
request is not counted. Open sessions are the session store's quota (``chat.protocol.store``), not this module's.

Not thread-safe: the server calls it from its event loop only.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

WINDOW_S = 60.0  # the sliding window of the per-minute limits
CONCURRENCY_RETRY_S = 1.0  # Retry-After of a refusal for concurrent turns (when a turn ends is not known)
LIMIT_NAMES = ("concurrent_turns", "requests_per_minute", "tokens_per_minute", "open_sessions")


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's limits; ``None``: no limit."""

    concurrent_turns: int | None = None  # turns running at once
    requests_per_minute: int | None = None  # requests admitted in the last WINDOW_S seconds
    tokens_per_minute: int | None = None  # prompt + completion tokens of turns ended in the last WINDOW_S seconds
    open_sessions: int | None = None  # sessions kept in the session store's memory (see chat.protocol.store)

    def over(self, defaults: Limits) -> Limits:
        """These limits, each one not set here taken from ``defaults``."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Limits(**{k: v if v is not None else getattr(defaults, k) for k, v in values.items()})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused and when to try again."""

    limit: str  # the limit it would break: one of LIMIT_NAMES
    value: int  # that limit's value
    retry_after_s: float  # seconds until the request would be admitted (if nothing else changes)
    held_s: float = 0.0  # seconds the answer waited before it went out (chat.server.transport.guard: Refusals held)

    @property
    def retry_after(self) -> int:
        """Whole seconds to wait from the answer, as HTTP's ``Retry-After`` gives them: rounded up, at least 1, or
        at least 0 for an answer that was held (its wait counted)."""
        if self.held_s > 0:
            return max(0, math.ceil(self.retry_after_s - self.held_s))
        return max(1, math.ceil(self.retry_after_s))

    @property
    def message(self) -> str:
        """What the client is told (OpenAI's 429 says which limit)."""
        what = self.limit.replace("_", " ")
        wait = max(0.0, self.retry_after_s - self.held_s)
        return f"rate limit reached: {what} is {self.value} for this tenant; retry after {wait:.1f} s"


class RateLimitedError(Exception):
    """A request was refused for a limit (wire code ``rate_limited``: HTTP 429 with ``Retry-After``)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal  # which limit, and when to retry


class SlidingWindow:
    """Amounts recorded at times; :meth:`used` is the sum of those recorded less than ``window_s`` seconds ago.

    Times must not decrease from one call to the next.
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s  # how long an amount counts
        self._entries: deque[tuple[float, int]] = deque()  # (time, amount), oldest first; all still counting
        self._total = 0  # sum of the entries' amounts

    def used(self, now: float) -> int:
        """The sum of amounts recorded in ``(now - window_s, now]``."""
        while self._entries and now - self._entries[0][0] >= self.window_s:
            self._total -= self._entries.popleft()[1]
        return self._total

    def add(self, now: float, amount: int) -> None:
        """Record ``amount`` at ``now``."""
        self.used(now)
        if amount > 0:
            self._entries.append((now, amount))
            self._total += amount

    def wait_below(self, now: float, limit: int) -> float:
        """Seconds from ``now`` until :meth:`used` is below ``limit`` (0 when it already is)."""
        total = self.used(now)
        if total < limit:
            return 0.0
        for at, amount in self._entries:  # oldest first: the time each one stops counting
            total -= amount
            if total < limit:
                return at + self.window_s - now
        return self.window_s  # only for a limit below 1, which Limits never holds


@dataclass(slots=True)
class _TenantState:
    active: int = 0  # turns started and not yet ended
    requests: SlidingWindow = field(default_factory=SlidingWindow)  # admitted requests (amount 1 each)
    tokens: SlidingWindow = field(default_factory=SlidingWindow)  # tokens of ended turns


class RateLimiter:
    """Every tenant's running turns and recent requests and tokens, against each tenant's :class:`Limits`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # seconds, never decreasing (time.monotonic; a fake in tests)
        self._tenants: dict[str, _TenantState] = {}  # by tenant id, made at first use

    def check(self, tenant: str, limits: Limits, turns: int = 1) -> Refusal | None:
        """Which limit a request of ``turns`` turns would break now (None: none); records nothing."""
        now, state = self.clock(), self._state(tenant)
        cap = limits.concurrent_turns
        if cap is not None and state.active + turns > cap:
            return Refusal("concurrent_turns", cap, CONCURRENCY_RETRY_S)
        rpm = limits.requests_per_minute
        if rpm is not None and state.requests.used(now) >= rpm:
            return Refusal("requests_per_minute", rpm, state.requests.wait_below(now, rpm))
        tpm = limits.tokens_per_minute
        if tpm is not None and state.tokens.used(now) >= tpm:
            return Refusal("tokens_per_minute", tpm, state.tokens.wait_below(now, tpm))
        return None

    def record(self, tenant: str) -> None:
        """Count one admitted request against ``tenant``'s requests per minute."""
        self._state(tenant).requests.add(self.clock(), 1)

    def admit(self, tenant: str, limits: Limits, turns: int = 1) -> Refusal | None:
        """:meth:`check`, and when nothing is broken :meth:`record` the request. Its turns count as running from
        :meth:`start_turn` to :meth:`end_turn`."""
        refusal = self.check(tenant, limits, turns)
        if refusal is None:
            self.record(tenant)
        return refusal

    def start_turn(self, tenant: str) -> None:
        """A turn of ``tenant`` runs (counted against its concurrent turns until :meth:`end_turn`)."""
        self._state(tenant).active += 1

    def end_turn(self, tenant: str) -> None:
        """A turn of ``tenant`` ended."""
        state = self._state(tenant)
        state.active = max(0, state.active - 1)

    def charge(self, tenant: str, tokens: int) -> None:
        """Count ``tokens`` (prompt + completion of a turn that ended) against ``tenant``'s tokens per minute."""
        self._state(tenant).tokens.add(self.clock(), tokens)

    def active(self, tenant: str) -> int:
        """Turns of ``tenant`` started and not yet ended."""
        return self._state(tenant).active

    def _state(self, tenant: str) -> _TenantState:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _TenantState()
        return state
