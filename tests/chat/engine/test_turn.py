"""chat.engine.turn: the turn pipeline on a weightless fake model: reuse, storage points, sampling limits, cancel,
bad input."""

from __future__ import annotations

import itertools

import pytest

from cache import PrefixCache
from chat.engine.errors import ContextOverflowError
from chat.engine.events import Delta, Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from tests.chat.engine.fakes import FakeRuntime


def turn(rt, cache, messages, **params) -> Done:
    deltas, done = run_to_end(Turn(rt, cache, TurnRequest(messages, SamplingParams(**params))))
    assert "".join(d.text for d in deltas) == done.text  # the stream adds up to the reply
    if cache is not None:
        cache.check_invariants()
        assert cache.stats().in_use == 0  # every lease was given back
    assert rt.open_runs == 0
    return done


def conversation(rt, cache, users: list[str]) -> list[Done]:
    messages: list[dict] = [{"role": "system", "content": "be brief"}]
    out = []
    for text in users:
        messages.append({"role": "user", "content": text})
        done = turn(rt, cache, messages)
        messages.append({"role": "assistant", "content": done.text})
        out.append(done)
    return out


@pytest.mark.parametrize("kind", ["normal", "recurrent"])
def test_later_turns_compute_only_their_new_tokens(kind):
    rt, cache = FakeRuntime(kind), PrefixCache()
    dones = conversation(rt, cache, ["hello", "and then?", "thanks"])
    assert dones[0].usage.cached_tokens == 0
    for prev, done in itertools.pairwise(dones):
        # everything up to the previous reply's last absorbed token is reused
        assert done.usage.cached_tokens >= prev.usage.prompt_tokens + prev.usage.completion_tokens - 1
        assert done.usage.cached_tokens < done.usage.prompt_tokens


@pytest.mark.parametrize("kind", ["normal", "recurrent"])
def test_replies_are_the_same_without_the_prefix_cache(kind):
    with_cache = conversation(FakeRuntime(kind), PrefixCache(), ["a", "b", "c", "d"])
    rt = FakeRuntime(kind)
    without = conversation(rt, None, ["a", "b", "c", "d"])
    assert [d.text for d in with_cache] == [d.text for d in without]
    assert all(d.usage.cached_tokens == 0 for d in without)


def test_a_hit_runs_the_model_only_on_the_suffix():
    rt, cache = FakeRuntime(), PrefixCache()
    messages = [{"role": "user", "content": "x" * 100}]
    first = turn(rt, cache, messages)
    before = rt.forwarded
    second = turn(
        rt, cache, [*messages, {"role": "assistant", "content": first.text}, {"role": "user", "content": "y"}]
    )
    suffix = second.usage.prompt_tokens - second.usage.cached_tokens
    assert rt.forwarded - before == suffix + second.usage.completion_tokens - 1


def test_regenerate_hits_one_token_short_and_gives_the_same_greedy_reply():
    rt, cache = FakeRuntime(), PrefixCache()
    messages = [{"role": "user", "content": "once more"}]
    first, again = turn(rt, cache, messages), turn(rt, cache, messages)
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
    assert again.text == first.text


def test_template_drift_still_hits_at_the_end_of_the_previous_prompt():
    # Recurrent state can only be restored at snapshots; the template drops the reply's <think> block, so the next
    # prompt leaves the stored reply early. The entry stored at the end of the rendered prompt still serves.
    rt = FakeRuntime("recurrent", script=lambda p: "<think>hmm</think>ok", drift=True)
    cache = PrefixCache()
    messages = [{"role": "user", "content": "hi"}]
    first = turn(rt, cache, messages)
    assert first.text == "<think>hmm</think>ok"
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
    second = turn(rt, cache, messages)
    assert second.usage.cached_tokens == first.usage.prompt_tokens


def test_edit_of_the_first_user_message_on_a_recurrent_model_reuses_the_system_prompt():
    rt, cache = FakeRuntime("recurrent"), PrefixCache()
    system = {"role": "system", "content": "you are terse"}
    turn(rt, cache, [system, {"role": "user", "content": "first"}])
    edited = turn(rt, cache, [system, {"role": "user", "content": "edited"}])
    assert edited.usage.cached_tokens == len(rt.render([system], add_generation_prompt=False))


def test_eos_stops_and_max_tokens_cuts_with_length():
    rt = FakeRuntime(script=lambda p: "abcdef")
    done = turn(rt, PrefixCache(), [{"role": "user", "content": "q"}])
    assert (done.text, done.finish_reason, done.usage.completion_tokens) == ("abcdef", "stop", 7)
    cut = turn(rt, PrefixCache(), [{"role": "user", "content": "q"}], max_tokens=3)
    assert (cut.text, cut.finish_reason, cut.usage.completion_tokens) == ("abc", "length", 3)


def test_stop_string_ends_the_reply_before_it_even_across_tokens():
    rt = FakeRuntime(script=lambda p: "one, two; three")
    done = turn(rt, PrefixCache(), [{"role": "user", "content": "q"}], stop=["; t", "zzz"])
    assert (done.text, done.finish_reason) == ("one, two", "stop")


def test_held_back_text_is_flushed_when_no_stop_string_follows():
    rt = FakeRuntime(script=lambda p: "ab;")
    done = turn(rt, PrefixCache(), [{"role": "user", "content": "q"}], stop=[";;"])
    assert (done.text, done.finish_reason) == ("ab;", "stop")


def test_utf8_characters_split_over_tokens_are_never_emitted_half():
    rt = FakeRuntime(script=lambda p: "é€😀")
    deltas, done = run_to_end(Turn(rt, PrefixCache(), TurnRequest([{"role": "user", "content": "q"}])))
    assert done.text == "é€😀"
    assert all("\ufffd" not in d.text for d in deltas)
    assert [d.text for d in deltas if d.text] == ["é", "€", "😀"]


def test_cancel_stops_at_the_next_step_and_keeps_the_cache_consistent():
    rt, cache = FakeRuntime(script=lambda p: "x" * 50), PrefixCache()
    gen = Turn(rt, cache, TurnRequest([{"role": "user", "content": "long please"}]))
    seen = []
    while len(seen) < 5:
        seen += [e for e in gen.step() if isinstance(e, Delta)]
    gen.cancel()
    events = gen.step()
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "cancelled"
    assert gen.done and gen.step() == []
    cache.check_invariants()
    assert cache.stats().in_use == 0 and rt.open_runs == 0
    # what was computed before the cancel is reused
    again = turn(rt, cache, [{"role": "user", "content": "long please"}])
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1


def test_a_prompt_over_the_context_window_fails_before_any_compute():
    rt = FakeRuntime(context_window=16)
    gen = Turn(rt, PrefixCache(), TurnRequest([{"role": "user", "content": "x" * 40}]))
    with pytest.raises(ContextOverflowError) as err:
        gen.step()
    assert err.value.prompt_tokens == 43 and err.value.context_window == 16
    assert rt.forwarded == 0 and rt.open_runs == 0


def test_the_reply_is_cut_at_the_context_window():
    rt = FakeRuntime(script=lambda p: "y" * 100, context_window=20)
    done = turn(rt, PrefixCache(), [{"role": "user", "content": "x" * 10}])
    assert done.finish_reason == "length" and done.usage.total_tokens == 20


def test_a_failing_model_reports_an_error_and_gives_everything_back():
    rt, cache = FakeRuntime(), PrefixCache()
    turn(rt, cache, [{"role": "user", "content": "warm"}])

    def broken(run, token_ids, last_only=False):
        raise RuntimeError("out of memory")

    rt.forward = broken
    done = turn(rt, cache, [{"role": "user", "content": "warm"}, {"role": "assistant", "content": "x"}])
    assert done.finish_reason == "error" and "out of memory" in str(done.error)


def test_the_prompt_is_servable_while_its_reply_is_still_decoding():
    rt, cache = FakeRuntime(script=lambda p: "z" * 30), PrefixCache()
    messages = [{"role": "user", "content": "shared question " * 4}]
    first = Turn(rt, cache, TurnRequest(messages))
    while not any(isinstance(e, Delta) for e in first.step()):
        pass
    # another session asks the same while the first still decodes
    _, second = run_to_end(Turn(rt, cache, TurnRequest(messages)))
    assert second.usage.cached_tokens == second.usage.prompt_tokens - 1
    first.cancel()
    first.step()
    assert cache.stats().in_use == 0 and rt.open_runs == 0


def test_an_entry_dropped_between_lookup_and_acquire_is_looked_up_again():
    from cache import LeaseError

    rt, cache = FakeRuntime(), PrefixCache()
    messages = [{"role": "user", "content": "x" * 50}]
    first = turn(rt, cache, messages)
    real_acquire, failures = cache.acquire, []

    def flaky(match, namespace):
        if not failures:
            failures.append(match)
            raise LeaseError("dropped after the lookup")
        return real_acquire(match, namespace)

    cache.acquire = flaky
    again = turn(rt, cache, [*messages, {"role": "assistant", "content": first.text}, {"role": "user", "content": "y"}])
    assert failures and again.usage.cached_tokens > 0 and again.finish_reason == "stop"
    cache.acquire = lambda match, namespace: (_ for _ in ()).throw(LeaseError("always"))
    cold = turn(rt, cache, [*messages, {"role": "assistant", "content": first.text}, {"role": "user", "content": "z"}])
    assert cold.usage.cached_tokens == 0 and cold.finish_reason == "stop"  # computed whole, not failed
