"""Breakpoints in the turn request: once the prompt is stored, the prefix up to each is pinned in the tenant's
namespace, and the turn's Done says what became of each (pinned, or why not)."""

from __future__ import annotations

from cache import PrefixCache
from chat.engine.events import CacheBreakpoint, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import PIN_REFUSALS, Turn, run_to_end
from tests.chat.engine.fakes import FakeRuntime

SYSTEM = "You are a careful agent. " * 8


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def convo(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def ask(runtime, cache, messages, breakpoints=(), salt=""):
    request = TurnRequest(messages, SamplingParams(max_tokens=6), salt=salt, breakpoints=tuple(breakpoints))
    turn = Turn(runtime, cache, request)
    return turn, run_to_end(turn)[1]


def system_length(runtime) -> int:
    return len(runtime.render([{"role": "system", "content": SYSTEM}], add_generation_prompt=False))


def at_system(runtime, ttl_s: int = 300) -> CacheBreakpoint:
    return CacheBreakpoint(system_length(runtime), ttl_s, "system.0")


def at(tokens: int, ttl_s: int = 300) -> CacheBreakpoint:
    return CacheBreakpoint(tokens, ttl_s, f"at.{tokens}")


def test_a_system_breakpoint_holds_the_system_prefix_through_a_flood_until_its_ttl_passes():
    runtime, clock = FakeRuntime(), Clock()
    probe = PrefixCache()
    ask(runtime, probe, convo("warm-up"))
    entry_bytes = probe.stats().bytes_per_tier["device"]
    cache = PrefixCache(device_budget_bytes=entry_bytes * 4, host_budget_bytes=0, clock=clock)  # 4 turns' worth
    _, done = ask(runtime, cache, convo("first question"), [at_system(runtime)], salt="a")
    (outcome,) = done.pins
    assert outcome.pinned and outcome.reason is None and outcome.length == system_length(runtime)
    for i in range(16):  # another tenant's turns fill the cache 4 times over
        ask(runtime, cache, convo(f"flood {i} " * 4), salt="b")
    assert cache.stats().evictions >= 12
    _, later = ask(runtime, cache, convo("a new session"), salt="a")
    assert later.usage.cached_tokens >= system_length(runtime)
    clock.t += 301  # the hit above renewed it at t=0: 300 s later it lapses
    assert cache.expire_pins() == 1
    for i in range(16):
        ask(runtime, cache, convo(f"flood again {i} " * 4), salt="b")
    assert ask(runtime, cache, convo("after the ttl"), salt="a")[1].usage.cached_tokens == 0


def test_each_breakpoint_pins_its_prefix_and_one_past_the_prompt_is_capped_at_its_length():
    runtime, cache = FakeRuntime(), PrefixCache(clock=Clock())
    turn, done = ask(runtime, cache, convo("q"), [at(5), at(11), at(10**6, 3600)])
    n = len(turn.prompt)
    assert [(o.length, o.pinned, o.reason) for o in done.pins] == [(5, True, None), (11, True, None), (n, True, None)]
    assert [o.breakpoint.where for o in done.pins] == ["at.5", "at.11", "at.1000000"]
    assert sorted((p.length, p.ttl_s) for p in cache.pins()) == [(5, 300.0), (11, 300.0), (n, 3600.0)]


def test_the_same_breakpoint_in_another_session_renews_the_pin_instead_of_pinning_its_own_entry():
    runtime, clock = FakeRuntime(), Clock()
    cache = PrefixCache(clock=clock)
    ask(runtime, cache, convo("one"), [at_system(runtime)])
    clock.t = 100.0
    ask(runtime, cache, convo("two"), [at_system(runtime)])
    (pin,) = cache.pins()
    assert pin.expires_at == 400.0 and cache.stats().pins_renewed == 1 and cache.stats().pinned_entries == 1


def test_pins_beyond_the_tenants_share_are_refused_and_said_so():
    runtime = FakeRuntime()
    probe_cache = PrefixCache()
    ask(runtime, probe_cache, convo("sizing"))
    entry_bytes = probe_cache.stats().bytes_per_tier["device"]
    cache = PrefixCache(device_budget_bytes=entry_bytes * 4, tenant_share=0.3, clock=Clock())  # 1.2 entries
    _, first = ask(runtime, cache, convo("question one"), [at(10**6)], salt="a")
    _, second = ask(runtime, cache, convo("a different question"), [at(10**6)], salt="a")
    assert first.pins[0].pinned
    assert (second.pins[0].pinned, second.pins[0].reason) == (False, "over_share")
    assert second.finish_reason in ("stop", "length")  # a refused pin is a hint not taken: the turn goes on


def test_breakpoints_that_cannot_be_held_are_reported():
    runtime = FakeRuntime()
    _, done = ask(runtime, None, convo("q"), [at(3)])
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "cache_off")]
    _, done = ask(runtime, PrefixCache(), convo("q"), [at(0)])
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "not_cached")]
    turn = Turn(runtime, PrefixCache(), TurnRequest(convo("q"), breakpoints=(at(3),)))
    turn.begin()
    (done,) = [e for e in turn.stop("cancelled") if hasattr(e, "pins")]  # stopped before its prompt was computed
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "not_reached")]
    assert {"not_cached", "over_share", "not_reached", "cache_off"} == set(PIN_REFUSALS)


def test_on_a_recurrent_model_the_prefill_stops_at_a_breakpoint_so_its_prefix_can_be_pinned():
    runtime = FakeRuntime("recurrent")
    _, done = ask(runtime, PrefixCache(clock=Clock()), convo("q"), [at(7)])
    assert [(o.length, o.pinned) for o in done.pins] == [(7, True)]
