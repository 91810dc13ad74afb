"""The server's side of per-tenant limits: a :class:`TenantGate` that admits or refuses each request for its tenant
(:mod:`chat.server.tenancy.ratelimit` decides), applies the tenant's default priority, and counts every tenant's turns
and tokens as they end (what ``/metrics`` shows per tenant).

Both transports submit turns through :meth:`TenantGate.engine_for`, an engine view that stamps the tenant's default
priority on a turn that gives none and reports each turn's end (its Done, or the error that ended it before one) to
the gate on the event loop: the turn stops counting as running, and its tokens are charged. Everything here runs on
the event loop (engine results are marshalled onto it), as the limiter requires.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from chat.engine.events import Done, Event, TurnRequest
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError
from chat.server.tenancy.policy import TenantPolicy
from chat.server.tenancy.ratelimit import Limits, RateLimitedError, RateLimiter, Refusal
from chat.server.transport.relay import relay_for


@dataclass(slots=True)
class TenantFigures:
    """What one tenant did since the server started (its ``/metrics`` series)."""

    turns: int = 0  # turns ended (any finish reason)
    prompt_tokens: int = 0  # prompt tokens of those turns
    cached_tokens: int = 0  # of those, served from the prefix cache
    completion_tokens: int = 0  # tokens generated
    rate_limited: int = 0  # requests refused for a limit


class TenantGate:
    """Per-tenant admission and accounting. ``policy_of(tenant id)`` gives a tenant's values from the keys file (read
    at every request, so a reloaded keys file applies at once); ``defaults`` are the server's."""

    def __init__(
        self,
        policy_of: Callable[[str], TenantPolicy],
        defaults: TenantPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy_of = policy_of  # tenant id -> its keys file values
        self.defaults = defaults  # the server's limits and priority (flags / TURNCACHE_*)
        self.limiter = RateLimiter(clock)  # the sans-I/O decisions
        self.figures: dict[str, TenantFigures] = {}  # by tenant id, made at first use

    def terms(self, tenant: str) -> tuple[Limits, int]:
        """``tenant``'s limits in force and its default priority."""
        return self.policy_of(tenant).resolve(self.defaults)

    def check(self, tenant: str, turns: int = 1) -> Refusal | None:
        """Which limit a request of ``turns`` turns would break (counted as refused), or None; records nothing."""
        refusal = self.limiter.check(tenant, self.terms(tenant)[0], turns)
        if refusal is not None:
            self.figures_of(tenant).rate_limited += 1
        return refusal

    def record(self, tenant: str) -> None:
        """Count an admitted request (after :meth:`check` found nothing broken)."""
        self.limiter.record(tenant)

    def admit(self, tenant: str, turns: int = 1) -> None:
        """Admit a request of ``turns`` turns, or refuse it.

        Raises:
            RateLimitedError: a limit would be broken (nothing was recorded).
            RequestError: ``invalid_request`` naming ``n``: the request alone holds more turns than the tenant may
                run at once (waiting would never help).
        """
        cap = self.terms(tenant)[0].concurrent_turns
        if cap is not None and turns > cap:
            message = f"n: this request runs {turns} turns at once; this tenant may run {cap}"
            raise RequestError(ErrorCode.INVALID_REQUEST, message, param="n")
        refusal = self.check(tenant, turns)
        if refusal is not None:
            raise RateLimitedError(refusal)
        self.record(tenant)

    def open_sessions(self, tenant: str) -> int | None:
        """How many sessions ``tenant`` may keep in the store's memory (None: no limit)."""
        return self.terms(tenant)[0].open_sessions

    def figures_of(self, tenant: str) -> TenantFigures:
        found = self.figures.get(tenant)
        if found is None:
            found = self.figures[tenant] = TenantFigures()
        return found

    def active(self, tenant: str) -> int:
        return self.limiter.active(tenant)

    def ended(self, tenant: str, done: Done | None) -> None:
        """A turn of ``tenant`` ended (``done`` None: it failed before computing anything)."""
        self.limiter.end_turn(tenant)
        if done is None:
            return
        usage, figures = done.usage, self.figures_of(tenant)
        figures.turns += 1
        figures.prompt_tokens += usage.prompt_tokens
        figures.cached_tokens += usage.cached_tokens
        figures.completion_tokens += usage.completion_tokens
        self.limiter.charge(tenant, usage.prompt_tokens + usage.completion_tokens)

    def engine_for(self, engine, tenant: str) -> TenantEngine:
        """``engine`` as ``tenant``'s turns see it (see the module docstring). Call on the event loop."""
        return TenantEngine(engine, self, tenant, asyncio.get_running_loop())


class TenantEngine:
    """An engine view for one tenant's requests: ``submit`` stamps the default priority and reports each turn's end
    to the gate; everything else is the engine's."""

    def __init__(self, engine, gate: TenantGate, tenant: str, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine  # the real engine (or a cluster's remote one)
        self._gate = gate  # told when each turn ends
        self._tenant = tenant  # whose turns these are
        self._loop = loop  # where the gate runs
        self._relay = relay_for(loop)  # the turn's end onto the loop, in order with its events

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    @property
    def unmetered(self):
        """The engine behind this view, for the server's own background turns (never a client's request)."""
        return self._engine

    def submit(self, request: TurnRequest, sink: Callable[[Event | BaseException], None]):
        """The engine's ``submit``, for this tenant.

        Raises:
            whatever the engine's ``submit`` raises (the turn then never counted as running).
        """
        if request.params.priority is None:
            priority = self._gate.terms(self._tenant)[1]
            request = replace(request, params=replace(request.params, priority=priority))
        ended = False

        def report(event: Event | BaseException) -> None:  # on the engine's thread
            nonlocal ended
            if not ended and isinstance(event, Done | BaseException):
                ended = True
                done = event if isinstance(event, Done) else None
                self._relay.call(self._gate.ended, self._tenant, done)
            sink(event)

        handle = self._engine.submit(request, report)
        self._gate.limiter.start_turn(self._tenant)
        return handle
