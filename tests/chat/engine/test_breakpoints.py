"""Breakpoints in the turn request: once the prompt is stored, the prefix up to each is pinned in the tenant's
namespace, and the turn's Done says what became of each (pinned, or why not)."""

from __future__ import annotations

import pytest

from cache import PrefixCache
from chat.engine.events import Breakpoint, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import PIN_REFUSALS, Turn, run_to_end
from chat.engine.volatile_lines import VolatileLines
from tests.chat.engine.fakes import FakeRuntime

SYSTEM = "You are a careful agent. " * 8


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def convo(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def ask(runtime, cache, messages, breakpoints=(), salt="", volatile=None):
    request = TurnRequest(messages, SamplingParams(max_tokens=6), salt=salt, breakpoints=tuple(breakpoints))
    turn = Turn(runtime, cache, request, volatile=volatile)
    return turn, run_to_end(turn)[1]


def system_length(runtime) -> int:
    return len(runtime.render([{"role": "system", "content": SYSTEM}], add_generation_prompt=False))


def test_a_system_breakpoint_holds_the_system_prefix_through_a_flood_until_its_ttl_passes():
    runtime, clock = FakeRuntime(), Clock()
    probe = PrefixCache()
    ask(runtime, probe, convo("warm-up"))
    entry_bytes = probe.stats().bytes_per_tier["device"]
    cache = PrefixCache(device_budget_bytes=entry_bytes * 4, host_budget_bytes=0, clock=clock)  # 4 turns' worth
    _, done = ask(runtime, cache, convo("first question"), [Breakpoint(message=0)], salt="a")
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


def test_offsets_messages_and_block_ends_resolve_to_prompt_lengths():
    runtime, cache = FakeRuntime(), PrefixCache(clock=Clock())
    bps = [
        Breakpoint(offset=5),
        Breakpoint(message=0, chars=10),  # a block boundary inside the system prompt
        Breakpoint(message=1, ttl_s=3600),  # the last message
        Breakpoint(offset=10**6),  # capped at the prompt's length: the same prefix, so the same pin
    ]
    turn, done = ask(runtime, cache, convo("q"), bps)
    n = len(turn.prompt)
    assert [o.length for o in done.pins] == [5, 1 + 10, n, n]  # the last message's end: the prompt's
    assert all(o.pinned for o in done.pins)
    assert sorted((p.length, p.ttl_s) for p in cache.pins()) == [(5, 300.0), (11, 300.0), (n, 3600.0)]


def test_the_same_breakpoint_in_another_session_renews_the_pin_instead_of_pinning_its_own_entry():
    runtime, clock = FakeRuntime(), Clock()
    cache = PrefixCache(clock=clock)
    ask(runtime, cache, convo("one"), [Breakpoint(message=0)])
    clock.t = 100.0
    ask(runtime, cache, convo("two"), [Breakpoint(message=0)])
    (pin,) = cache.pins()
    assert pin.expires_at == 400.0 and cache.stats().pins_renewed == 1 and cache.stats().pinned_entries == 1


def test_pins_beyond_the_tenants_share_are_refused_and_said_so():
    runtime = FakeRuntime()
    probe_cache = PrefixCache()
    ask(runtime, probe_cache, convo("sizing"))
    entry_bytes = probe_cache.stats().bytes_per_tier["device"]
    cache = PrefixCache(device_budget_bytes=entry_bytes * 4, tenant_share=0.3, clock=Clock())  # 1.2 entries
    _, first = ask(runtime, cache, convo("question one"), [Breakpoint(message=1)], salt="a")
    _, second = ask(runtime, cache, convo("a different question"), [Breakpoint(message=1)], salt="a")
    assert first.pins[0].pinned
    assert (second.pins[0].pinned, second.pins[0].reason) == (False, "over_share")
    assert second.finish_reason in ("stop", "length")  # a refused pin is a hint not taken: the turn goes on


def test_breakpoints_that_cannot_be_placed_are_reported():
    runtime = FakeRuntime()
    _, done = ask(runtime, None, convo("q"), [Breakpoint(message=0)])
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "cache_off")]
    _, done = ask(runtime, PrefixCache(), convo("q"), [Breakpoint(message=7), Breakpoint(offset=0)])
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "outside_prompt"), (False, "not_cached")]
    request = TurnRequest(
        [], SamplingParams(max_tokens=2), prompt_tokens=[1, 2, 3], breakpoints=(Breakpoint(message=0),)
    )
    done = run_to_end(Turn(runtime, PrefixCache(), request))[1]
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "outside_prompt")]
    turn = Turn(runtime, PrefixCache(), TurnRequest(convo("q"), breakpoints=(Breakpoint(message=0),)))
    turn.begin()
    (done,) = [e for e in turn.stop("cancelled") if hasattr(e, "pins")]  # stopped before its prompt was computed
    assert [(o.pinned, o.reason) for o in done.pins] == [(False, "not_reached")]
    assert {"not_cached", "over_share", "not_reached", "outside_prompt", "cache_off"} == set(PIN_REFUSALS)


def test_a_breakpoint_after_a_dropped_volatile_line_counts_in_the_rendered_prompt():
    runtime, cache = FakeRuntime(), PrefixCache(clock=Clock())
    line = "x-anthropic-billing-header: cc_version=2.1.197.c8e; cc_entrypoint=sdk-cli;\n"
    messages = [{"role": "system", "content": line + SYSTEM}, {"role": "user", "content": "q"}]
    _, done = ask(runtime, cache, messages, [Breakpoint(message=0)], volatile=VolatileLines())
    assert done.pins[0].pinned and done.pins[0].length == system_length(runtime)


@pytest.mark.parametrize(
    "fields",
    [{}, {"offset": 1, "message": 0}, {"offset": -1}, {"message": 0, "ttl_s": 0}, {"chars": 3, "offset": 2}],
)
def test_a_malformed_breakpoint_is_refused_when_made(fields):
    with pytest.raises(ValueError):
        Breakpoint(**fields)
