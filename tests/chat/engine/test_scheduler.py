"""The scheduler on a weightless fake model: one forward per step over every active turn, budgets, fairness, cancel
within a step, a failing feed fails only its own turn, settings out of range are refused by name."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from cache import PrefixCache
from chat.engine.errors import InvalidBatchSettingError
from chat.engine.events import Done, TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.scheduler import MIN_PREFILL_CHUNK, SHARE_MIN, BatchSettings, Scheduler
from chat.engine.turn import Turn, run_to_end
from tests.chat.engine.fakes import USER as USER_TOKEN
from tests.chat.engine.fakes import FakeRuntime


class CountingRuntime(FakeRuntime):
    """Records every step's feeds as (turn label, tokens)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[list[int]] = []  # tokens per feed, per forward_batch call
        self.runs_per_step: list[list[int]] = []  # id() of each feed's run, per call

    def forward_batch(self, feeds, interrupt=None):
        self.steps.append([len(f.tokens) for f in feeds])
        self.runs_per_step.append([id(f.run) for f in feeds])
        return super().forward_batch(feeds, interrupt)


def request(text: str, **params) -> TurnRequest:
    return TurnRequest([{"role": "user", "content": text}], SamplingParams(**params))


def begun(rt, cache, req) -> Turn:
    turn = Turn(rt, cache, req)
    turn.begin()
    return turn


def decoding_turns(rt, scheduler: Scheduler, n: int, max_tokens: int) -> list[Turn]:
    """``n`` one-question turns added to ``scheduler`` and stepped until every one of them is decoding."""
    turns = [begun(rt, None, request(f"d{i}", max_tokens=max_tokens)) for i in range(n)]
    for turn in turns:
        scheduler.add(turn)
    while not all(t.decoding for t in turns):
        scheduler.step()
    return turns


def run_all(scheduler: Scheduler, turns: list[Turn], *, add: bool = True) -> dict[int, Done]:
    """Step until every turn is done (adding ``turns`` first unless ``add`` is False: they are in already); return
    each turn's Done by its index in ``turns``."""
    for turn in turns if add else ():
        scheduler.add(turn)
    done: dict[int, Done] = {}
    index = {id(t): i for i, t in enumerate(turns)}
    for _ in range(10_000):
        if not scheduler.busy:
            break
        for turn, events in scheduler.step():
            for event in events:
                if isinstance(event, Done):
                    done[index[id(turn)]] = event
    assert not scheduler.busy, "the scheduler did not finish"
    return done


def alone(text: str, **params) -> Done:
    return run_to_end(Turn(FakeRuntime(), None, request(text, **params)))[1]


def test_concurrent_turns_share_forwards_and_give_the_replies_they_give_alone():
    rt, cache = CountingRuntime(), PrefixCache()
    texts = [f"question number {i}" * (i + 1) for i in range(6)]
    turns = [begun(rt, cache, request(t)) for t in texts]
    done = run_all(Scheduler(rt), turns)
    for i, text in enumerate(texts):
        want = alone(text)
        assert (done[i].text, done[i].token_ids, done[i].finish_reason) == (want.text, want.token_ids, "stop")
    assert max(len(s) for s in rt.steps) == 6  # every turn in one forward
    assert len(rt.steps) < sum(len(d.token_ids) for d in done.values()) / 4  # far fewer forwards than tokens
    assert cache.stats().in_use == 0 and rt.open_runs == 0
    cache.check_invariants()


@pytest.mark.parametrize("max_batch,budget", [(1, 16), (3, 16), (4, 40), (32, 256)])
def test_every_step_keeps_to_the_batch_size_and_the_token_budget(max_batch, budget):
    rt = CountingRuntime()
    turns = [begun(rt, None, request("x" * (20 + 15 * i))) for i in range(7)]
    done = run_all(Scheduler(rt, BatchSettings(max_batch=max_batch, token_budget=budget)), turns)
    assert len(done) == 7 and all(d.finish_reason == "stop" for d in done.values())
    for sizes in rt.steps:
        assert len(sizes) <= max_batch
        # a step holds at most the budget, or one decode token per seat plus the least prefill chunk
        assert sum(sizes) <= max(budget, len(sizes) - 1 + MIN_PREFILL_CHUNK)


def test_a_long_prefill_and_31_decoding_turns_all_make_progress():
    rt = CountingRuntime(script=lambda prompt: "z" * 200)  # long replies: they keep decoding
    settings = BatchSettings(max_batch=32, token_budget=48)
    scheduler = Scheduler(rt, settings)
    decoding = decoding_turns(rt, scheduler, 31, max_tokens=150)
    long = begun(rt, None, request("p" * 1500, max_tokens=5))
    scheduler.add(long)
    produced = {id(t): len(t.reply.tokens) for t in decoding}
    for _ in range(10):
        before = len(long._fed)
        scheduler.step()
        assert len(long._fed) - before >= MIN_PREFILL_CHUNK  # the prompt moves every step...
        assert len(rt.steps[-1]) == 32  # ...and so does every decoding turn, in the same forward
    assert all(len(t.reply.tokens) == produced[id(t)] + 10 for t in decoding)


def test_more_decoding_turns_than_seats_take_turns_round_robin():
    rt = CountingRuntime(script=lambda prompt: "y" * 100)
    scheduler = Scheduler(rt, BatchSettings(max_batch=4, token_budget=64))
    turns = [begun(rt, None, request(f"t{i}", max_tokens=60)) for i in range(10)]
    for turn in turns:
        scheduler.add(turn)
    while not all(t.decoding for t in turns):
        scheduler.step()
    counts_before = [len(t.reply.tokens) for t in turns]
    for _ in range(10):  # 10 steps x 4 seats = 40 tokens over 10 turns
        scheduler.step()
    gained = [len(t.reply.tokens) - b for t, b in zip(turns, counts_before, strict=True)]
    assert sum(gained) == 40 and set(gained) == {4}


def test_a_cancel_takes_effect_at_the_next_step():
    script = lambda prompt: "w" * 100  # noqa: E731
    rt = CountingRuntime(script=script)
    scheduler = Scheduler(rt)
    turns = [begun(rt, None, request(f"c{i}", max_tokens=80)) for i in range(3)]
    for turn in turns:
        scheduler.add(turn)
    for _ in range(5):
        scheduler.step()
    victim = turns[1]
    victim_run = id(victim._run)
    victim.cancel()
    results = {id(t): events for t, events in scheduler.step()}
    done = results[id(victim)][-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled" and victim.done
    assert victim_run not in rt.runs_per_step[-1] and len(rt.steps[-1]) == 2  # the others went on in that step
    assert rt.open_runs == 2
    others = run_all(scheduler, [turns[0], turns[2]], add=False)
    for i, turn in enumerate((turns[0], turns[2])):
        alone_rt = FakeRuntime(script=lambda prompt: "r" * 60)
        alone_rt.can_rewind = True
        want = run_to_end(Turn(FakeRuntime(script=script), None, turn.request))[1]
        assert others[i].token_ids == want.token_ids and others[i].finish_reason == "length"


def test_a_failing_feed_fails_only_its_turn_and_the_others_give_their_own_replies():
    rt, cache = CountingRuntime(), PrefixCache()
    rt.poison = ord("!")
    texts = ["fine one", "this one fails " + "late " * 10 + "!", "fine two", "fine three"]
    turns = [begun(rt, cache, request(t)) for t in texts]
    done = run_all(Scheduler(rt, BatchSettings(token_budget=16)), turns)  # the failing prompt's first chunks pass
    assert done[1].finish_reason == "error" and str(done[1].error) == "poisoned feed"
    poisoned = turns[1]
    assert len(poisoned._fed) >= 16  # some of its prompt was computed before the failing chunk...
    match = cache.lookup(poisoned.namespace, [*poisoned.prompt, 1])
    assert match is None or match.length == 1  # ...yet none was stored (the others share only the role token)
    for i in (0, 2, 3):
        want = alone(texts[i])
        assert (done[i].token_ids, done[i].finish_reason) == (want.token_ids, "stop")
    assert cache.stats().in_use == 0 and rt.open_runs == 0
    cache.check_invariants()


def test_a_runtime_that_raises_fails_the_step_and_the_scheduler_goes_on():
    rt = CountingRuntime()
    scheduler = Scheduler(rt)
    broken = [begun(rt, None, request(f"b{i}")) for i in range(2)]
    for turn in broken:
        scheduler.add(turn)
    real = rt.forward_batch
    rt.forward_batch = lambda feeds, interrupt=None: (_ for _ in ()).throw(RuntimeError("runtime bug"))
    results = scheduler.step()
    assert all(events[-1].finish_reason == "error" for _, events in results) and not scheduler.busy
    rt.forward_batch = real
    assert run_all(scheduler, [begun(rt, None, request("after"))])[0].text == alone("after").text


@pytest.mark.parametrize(
    "settings,field",
    [
        ({"max_batch": 0}, "max_batch"),
        ({"max_batch": 257}, "max_batch"),
        ({"max_batch": 2.5}, "max_batch"),
        ({"token_budget": 15}, "token_budget"),
        ({"token_budget": 8193}, "token_budget"),
        ({"token_budget": True}, "token_budget"),
        ({"yield_budget": 1}, "yield_budget"),
        ({"yield_budget": -1}, "yield_budget"),
        ({"yield_budget": 8193}, "yield_budget"),
        ({"yield_hold_s": -0.5}, "yield_hold_s"),
        ({"yield_hold_s": 3601}, "yield_hold_s"),
        ({"yield_hold_s": "10"}, "yield_hold_s"),
        ({"yield_hold_s": True}, "yield_hold_s"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_setting(settings, field):
    with pytest.raises(InvalidBatchSettingError) as info:
        BatchSettings(**settings)
    assert info.value.field == field and field in str(info.value)


def test_yielding_can_be_turned_off_and_the_hold_can_be_zero():
    assert BatchSettings(yield_budget=0, yield_hold_s=0).yield_budget == 0


# ------------------------------------------------------------------ prefixes shared in flight

SYSTEM_PROMPT = "You are a careful assistant who answers in full sentences. " * 2


def chat(user: str, salt: str = "", **params) -> TurnRequest:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return TurnRequest(messages, SamplingParams(**params), salt=salt)


def run_together(requests: list[TurnRequest], *, share: bool, monkeypatch, kind: str = "normal", **settings):
    """Begin every request at once (all miss the empty cache), step them to the end; (runtime, turns, dones)."""
    import chat.engine.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "SHARE_MIN", scheduler_module.SHARE_MIN if share else 10**9)
    rt, cache = CountingRuntime(kind), PrefixCache()
    turns = [begun(rt, cache, r) for r in requests]
    assert all(t.cached_tokens == 0 for t in turns)
    done = run_all(Scheduler(rt, BatchSettings(**settings)), turns)
    assert cache.stats().in_use == 0 and rt.open_runs == 0
    cache.check_invariants()
    return rt, turns, done


def test_turns_that_arrive_together_compute_their_common_system_prompt_once(monkeypatch):
    users = ["What is a prime number?", "Name three rivers.", "Why is the sea salty?", "Count to five."]
    requests = [chat(u) for u in users]
    rt, turns, done = run_together(requests, share=True, monkeypatch=monkeypatch)
    shared = [turns[i].shared_prefix(turns[0]) for i in range(4)]
    assert shared[1] > len(SYSTEM_PROMPT)  # the system message and the user role token
    assert rt.steps[0] == [len(turns[0].prompt)]  # the first step computes the leader's prompt alone...
    assert [d.usage.cached_tokens for d in done.values()] == [0, *shared[1:]]  # ...the others restore it
    for i, u in enumerate(users):
        alone_rt = FakeRuntime(script=lambda prompt: "r" * 60)
        alone_rt.can_rewind = True
        want = run_to_end(Turn(FakeRuntime(), None, chat(u)))[1]
        assert (done[i].token_ids, done[i].finish_reason) == (want.token_ids, "stop")
    rt_off, _, done_off = run_together(requests, share=False, monkeypatch=monkeypatch)
    assert [d.usage.cached_tokens for d in done_off.values()] == [0, 0, 0, 0]
    assert rt_off.forwarded - rt.forwarded == sum(shared[1:])  # exactly the shared tokens were not recomputed


@pytest.mark.parametrize(
    "requests,kind,why",
    [
        ([chat("What is a prime?"), chat("What is a prime?", salt="tenant-b")], "normal", "another tenant"),
        ([chat("What is a prime?"), chat("What is a prime?")], "recurrent", "recurrent state"),
        (
            [request("ab" + "x" * 40), request("ab" + "y" * 40)],
            "normal",
            f"fewer than {SHARE_MIN} shared tokens",
        ),
        (
            [chat("Hi."), chat("Tell me, " + "in great detail, " * 30 + "about rivers.")],
            "normal",
            "under a quarter of the follower's prompt",
        ),
    ],
)
def test_a_turn_does_not_wait_where_nothing_worth_it_can_be_shared(requests, kind, why, monkeypatch):
    rt, _, done = run_together(requests, share=True, monkeypatch=monkeypatch, kind=kind)
    assert len(rt.steps[0]) == 2, why  # both prompts in the first forward
    assert done[1].usage.cached_tokens == 0


def test_a_follower_goes_on_when_its_leader_is_cancelled_or_fails(monkeypatch):
    import chat.engine.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "SHARE_MIN", 16)
    for ending in ("cancel", "fail"):
        rt, cache = CountingRuntime(), PrefixCache()
        rt.poison = ord("!") if ending == "fail" else None
        leader_text = "Describe the sea" + " at length" * 20 + ("!" if ending == "fail" else "")
        leader = begun(rt, cache, chat(leader_text))
        follower = begun(rt, cache, chat("Describe the sea briefly."))
        scheduler = Scheduler(rt, BatchSettings(token_budget=16))  # the leader's prompt takes several steps
        scheduler.add(leader)
        scheduler.add(follower)
        scheduler.step()
        assert rt.runs_per_step[0] == [id(leader._run)]  # the follower waits
        if ending == "cancel":
            leader.cancel()
        ends = run_all(scheduler, [follower, leader], add=False)
        done = ends[0]
        alone_rt = FakeRuntime(script=lambda prompt: "r" * 60)
        alone_rt.can_rewind = True
        want = run_to_end(Turn(FakeRuntime(), None, chat("Describe the sea briefly.")))[1]
        assert (done.token_ids, done.finish_reason) == (want.token_ids, "stop"), ending
        assert ends[1].finish_reason == ("cancelled" if ending == "cancel" else "error")
        # a cancelled leader stored what it had computed (the follower restored it); a failed one stored nothing
        assert (done.usage.cached_tokens >= 16) == (ending == "cancel")
        assert cache.stats().in_use == 0 and rt.open_runs == 0
        cache.check_invariants()


def test_shared_prefix_stops_at_the_first_media_item_that_differs():
    from cache import MediaSpan

    rt = FakeRuntime()
    tokens = [USER_TOKEN, *b"look at this: ", *([ord("#")] * 8), *b" and say what it is", 258, 257]
    cat, dog = MediaSpan(15, 23, "image", "sha256:cat"), MediaSpan(15, 23, "image", "sha256:dog")

    def turn_with(media, salt=""):
        turn = begun(rt, None, TurnRequest([], SamplingParams(), salt=salt, prompt_tokens=tokens))
        turn.media = media
        return turn

    a, b = turn_with((cat,)), turn_with((dog,))
    assert a.shared_prefix(turn_with((cat,))) == len(tokens)  # the same image: everything
    assert a.shared_prefix(b) == b.shared_prefix(a) == 15  # another image: up to where it starts
    assert a.shared_prefix(turn_with(())) == turn_with(()).shared_prefix(a) == 15  # an image against none
    assert a.shared_prefix(turn_with((cat,), salt="other tenant")) == 0
    other = begun(rt, None, TurnRequest([], SamplingParams(), prompt_tokens=[*tokens[:7], 1, *tokens[8:]]))
    assert turn_with(()).shared_prefix(other) == 7  # tokens: the longest common start


def test_followers_follow_a_turn_that_computes_not_one_that_waits(monkeypatch):
    # b and c share more with each other than with a; c still follows a, so both go on after one step
    longer = "Tell me about the history of the river and its towns, "
    requests = [chat("Hello there, how are you?"), chat(longer + "briefly."), chat(longer + "at length.")]
    rt, turns, done = run_together(requests, share=True, monkeypatch=monkeypatch)
    assert turns[2].shared_prefix(turns[1]) > turns[2].shared_prefix(turns[0]) + SHARE_MIN
    assert len(rt.steps[0]) == 1 and len(rt.steps[1]) == 3  # a alone; then a's first token, b's and c's prompts
    assert [done[i].usage.cached_tokens for i in range(3)] == [0, *(turns[i].shared_prefix(turns[0]) for i in (1, 2))]


# ------------------------------------------------------------------ priorities and aging

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import chat.engine.scheduler as scheduler_module  # noqa: E402


def test_a_higher_priority_prefill_goes_first_and_equal_ones_keep_their_order():
    rt = CountingRuntime()
    scheduler = Scheduler(rt, BatchSettings(max_batch=4, token_budget=16))
    low, same, high = (begun(rt, None, request("p" * 40, priority=p)) for p in (5, 5, -5))
    for turn in (low, same, high):
        scheduler.add(turn)
    scheduler.step()
    assert rt.runs_per_step[0] == [id(high._run)]  # the whole budget to the higher priority, though it came last
    assert scheduler._prefilling == [high, low, same]


def test_a_better_priority_prefill_has_its_step_to_itself_and_the_worse_ones_go_on_after():
    rt = CountingRuntime(script=lambda prompt: "ok")
    scheduler = Scheduler(rt, BatchSettings(max_batch=8, token_budget=64, yield_budget=0))
    batch = [begun(rt, None, request(f"batch {i} " + "p" * 200)) for i in range(2)]
    for turn in batch:
        scheduler.add(turn)
    scheduler.step()
    assert sum(rt.steps[0]) == 64  # the batch prompts fill the budget
    chat = begun(rt, None, request("hi", priority=-5))
    scheduler.add(chat)
    scheduler.step()
    assert rt.runs_per_step[1] == [id(chat._run)] and rt.steps[1] == [len(chat.prompt)]  # no batch prompt rides along
    assert chat.decoding
    scheduler.step()  # the batch prompts go on beside the chat turn's decoding (yielding off: the whole budget)
    assert rt.runs_per_step[2] == [id(chat._run), id(batch[0]._run)] and sum(rt.steps[2]) == 64


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def worse_tokens(rt: CountingRuntime, turns: list[Turn], step: int) -> int:
    """Tokens of ``turns`` in the forward of ``step``."""
    runs = {id(t._run) for t in turns}
    return sum(n for n, run in zip(rt.steps[step], rt.runs_per_step[step], strict=True) if run in runs)


def test_while_a_better_priority_is_around_worse_turns_share_the_yield_budget_until_the_hold_ends():
    rt, clock = CountingRuntime(script=lambda prompt: "z" * 400), Clock()
    settings = BatchSettings(max_batch=16, token_budget=128, yield_budget=24, yield_hold_s=5.0)
    scheduler = Scheduler(rt, settings, clock=clock)
    decoding = decoding_turns(rt, scheduler, 4, max_tokens=300)
    batch = [*decoding, *(begun(rt, None, request(f"batch {i} " + "p" * 900)) for i in range(2))]
    for turn in batch[4:]:
        scheduler.add(turn)
    scheduler.step()
    assert worse_tokens(rt, batch, -1) == 128  # alone, the batch turns take the whole budget
    chat = begun(rt, None, request("hello there", max_tokens=20, priority=-3))
    scheduler.add(chat)
    steps_before = len(rt.steps)
    while not chat.done:
        scheduler.step()
        clock.now += 0.1
    for step in range(steps_before + 1, len(rt.steps)):  # the chat turn's own prompt step aside
        assert worse_tokens(rt, batch, step) == 24  # 4 decode tokens + 20 prompt tokens
    clock.now += 4.9  # within the hold: the chat's next question may be on its way
    scheduler.step()
    assert worse_tokens(rt, batch, -1) == 24
    clock.now += 0.2  # the hold is over
    scheduler.step()
    assert worse_tokens(rt, batch, -1) == 128


def test_yielding_decoders_take_at_most_the_yield_budget_of_seats_round_robin():
    rt = CountingRuntime(script=lambda prompt: "z" * 400)
    settings = BatchSettings(max_batch=64, token_budget=256, yield_budget=16, yield_hold_s=0)
    scheduler = Scheduler(rt, settings)
    batch = [begun(rt, None, request(f"d{i}", max_tokens=300)) for i in range(40)]
    chat = begun(rt, None, request("c", max_tokens=300, priority=-1))
    for turn in (*batch, chat):
        scheduler.add(turn)
    while not all(t.decoding for t in (*batch, chat)):
        scheduler.step()
    before = [len(t.reply.tokens) for t in batch]
    for _ in range(10):  # 10 steps x 16 seats = 160 tokens over 40 turns
        scheduler.step()
        assert worse_tokens(rt, batch, -1) == 16 and id(chat._run) in rt.runs_per_step[-1]
    assert [len(t.reply.tokens) - b for t, b in zip(batch, before, strict=True)] == [4] * 40


def test_while_yielding_a_step_holds_at_most_the_yield_budget_even_of_prompts_alone():
    """No least prefill chunk for a yielding prompt: the step a better turn may have to wait for stays within the
    yield budget (it was yield_budget + MIN_PREFILL_CHUNK)."""
    rt = CountingRuntime(script=lambda prompt: "ok")
    scheduler = Scheduler(rt, BatchSettings(max_batch=8, token_budget=256, yield_budget=6, yield_hold_s=100.0))
    chat = begun(rt, None, request("hi", max_tokens=2, priority=-1))
    scheduler.add(chat)
    while not chat.done:
        scheduler.step()  # the chat tenant is around from now on (the hold)
    batch = begun(rt, None, request("batch " + "p" * 300))
    scheduler.add(batch)
    for _ in range(10):
        scheduler.step()
        assert rt.steps[-1] == [6] and rt.runs_per_step[-1] == [id(batch._run)]


def test_while_yielding_worse_replies_leave_half_the_yield_budget_to_worse_prompts():
    rt = CountingRuntime(script=lambda prompt: "z" * 400)
    scheduler = Scheduler(rt, BatchSettings(max_batch=64, token_budget=256, yield_budget=16, yield_hold_s=100.0))
    decoding_turns(rt, scheduler, 40, max_tokens=300)
    chat = begun(rt, None, request("c", max_tokens=2, priority=-1))
    scheduler.add(chat)
    while not chat.done:
        scheduler.step()
    prompt = begun(rt, None, request("batch " + "p" * 200))
    scheduler.add(prompt)
    for _ in range(10):
        scheduler.step()
        fed = dict(zip(rt.runs_per_step[-1], rt.steps[-1], strict=True))
        assert fed.pop(id(prompt._run)) == 8  # half the yield budget: the prompt keeps moving
        assert len(fed) == 8 and set(fed.values()) == {1}  # and the replies share the other half, a token each


def test_the_step_of_a_better_turns_first_token_carries_no_worse_reply():
    rt = CountingRuntime(script=lambda prompt: "z" * 400)
    scheduler = Scheduler(rt, BatchSettings(max_batch=16, token_budget=64))
    batch = decoding_turns(rt, scheduler, 6, max_tokens=300)
    chat = begun(rt, None, request("a question", max_tokens=5, priority=-2))
    scheduler.add(chat)
    scheduler.step()
    assert rt.runs_per_step[-1] == [id(chat._run)] and chat.decoding  # its prompt and first token, alone
    scheduler.step()  # then the batch replies go on beside it
    assert set(rt.runs_per_step[-1]) == {id(chat._run), *(id(t._run) for t in batch)}


def test_prefills_that_keep_moving_do_not_overtake_a_new_better_turn():
    """Batch prompts waiting behind their own tenant's older prompts (as they do while yielding, for many steps) must
    not count as starved: a new chat turn's prompt step stays its own."""
    rt, clock = CountingRuntime(script=lambda prompt: "ok"), Clock()
    scheduler = Scheduler(rt, BatchSettings(max_batch=16, token_budget=64, yield_budget=16), clock=clock)
    batch = [begun(rt, None, request(f"batch {i} " + "p" * 600)) for i in range(4)]
    for turn in batch:
        scheduler.add(turn)
    chat = begun(rt, None, request("hi", max_tokens=2, priority=-1))
    scheduler.add(chat)
    while not chat.done:
        scheduler.step()  # the chat turn is around: the batch prompts yield, the later ones wait for many steps
    for question in range(3):
        for _ in range(3 * scheduler_module.AGING_STEPS):
            scheduler.step()
        assert not any(t.done for t in batch)
        chat = begun(rt, None, request(f"and then {question}", max_tokens=2, priority=-1))
        scheduler.add(chat)
        scheduler.step()
        assert rt.runs_per_step[-1] == [id(chat._run)], question  # no batch chunk rides along
        while not chat.done:
            scheduler.step()


def test_prefills_of_equal_priority_still_share_a_step():
    rt = CountingRuntime()
    scheduler = Scheduler(rt, BatchSettings(max_batch=8, token_budget=64))
    turns = [begun(rt, None, request(f"t{i}", priority=3)) for i in range(3)]
    for turn in turns:
        scheduler.add(turn)
    scheduler.step()
    assert rt.runs_per_step[0] == [id(t._run) for t in turns]


def test_higher_priority_decoders_take_the_seats_and_the_others_still_get_tokens():
    rt = CountingRuntime(script=lambda prompt: "y" * 300)
    scheduler = Scheduler(rt, BatchSettings(max_batch=2, token_budget=64))
    high = [begun(rt, None, request(f"h{i}", max_tokens=250, priority=-1)) for i in range(2)]
    low = begun(rt, None, request("low", max_tokens=250, priority=1))
    for turn in (*high, low):
        scheduler.add(turn)
    while not all(t.decoding for t in (*high, low)):
        scheduler.step()
    before = [len(t.reply.tokens) for t in (*high, low)]
    waits, last = [], len(low.reply.tokens)
    for _ in range(100):
        scheduler.step()
        if len(low.reply.tokens) > last:
            waits.append(0)
            last = len(low.reply.tokens)
        elif waits:
            waits[-1] += 1
    gained = [len(t.reply.tokens) - b for t, b in zip((*high, low), before, strict=True)]
    assert gained[0] > gained[2] and gained[1] > gained[2] > 0  # higher priority decodes more, the low one goes on
    # a seat at least every (p - q) * AGING_STEPS + ceil(decoding / seats) steps
    assert max(waits) <= 2 * scheduler_module.AGING_STEPS + 2


def stream_of_higher_priority(low_priority: int, high_priority: int, per_step: int, budget_steps: int) -> int | None:
    """A turn of ``low_priority`` arrives, then ``per_step`` turns of ``high_priority`` every step, forever; return
    the step at which the low one is done (None: not within ``budget_steps``)."""
    rt = CountingRuntime(script=lambda prompt: "ok")
    scheduler = Scheduler(rt, BatchSettings(max_batch=2, token_budget=16))
    low = begun(rt, None, request("L" * 30, max_tokens=3, priority=low_priority))
    scheduler.add(low)
    for step in range(1, budget_steps + 1):
        for i in range(per_step):
            scheduler.add(begun(rt, None, request(f"H{step}.{i}" + "h" * 20, max_tokens=3, priority=high_priority)))
        for turn, events in scheduler.step():
            if turn is low and any(isinstance(e, Done) for e in events):
                return step
    return None


@settings(max_examples=25, deadline=None)
@given(low=st.integers(-100, 100), gap=st.integers(0, 12), per_step=st.integers(1, 2))
def test_a_low_priority_turn_is_served_within_the_bound_however_many_higher_ones_keep_coming(low, gap, per_step):
    high = max(-100, low - gap)
    window = (low - high) * scheduler_module.AGING_STEPS  # only arrivals within it can overtake the low turn
    ahead = window * per_step  # turns that may rank ahead of it, each needing a few steps of work
    bound = 4 * ahead + window + 40
    done_at = stream_of_higher_priority(low, high, per_step, bound)
    assert done_at is not None and done_at <= bound, (done_at, bound)


def test_without_aging_the_same_stream_would_starve_the_low_priority_turn(monkeypatch):
    monkeypatch.setattr(scheduler_module, "AGING_STEPS", 10**6)
    assert stream_of_higher_priority(10, 0, 1, 4 * 40 + 40 + 40) is None


# ------------------------------------------------------------------ yielding, against a reference


@st.composite
def workloads(draw, *, priorities):
    """Turns as (arrival step, prompt length, reply cap, priority), arrivals in order."""
    n = draw(st.integers(2, 9))
    turns = [
        (
            draw(st.integers(0, 30)),
            draw(st.integers(1, 150)),
            draw(st.integers(1, 30)),
            draw(st.sampled_from(priorities)),
        )
        for _ in range(n)
    ]
    return sorted(turns, key=lambda t: t[0])


def drive(workload, settings: BatchSettings, *, dt: list[float] | None = None, check=None) -> tuple[list, dict]:
    """Run ``workload`` (turns added at their arrival step); the clock moves by ``dt[step % len(dt)]`` before each
    step. ``check(step, top, fed, prompts)`` sees every step: the reference's best priority around, each fed turn's
    (priority, tokens, was decoding) and the priorities of the turns prefilling before it. Returns (the forwards'
    feeds as (turn index, tokens), each turn's reply tokens and finish reason)."""
    rt, clock = CountingRuntime(script=lambda prompt: "r" * 60), Clock()
    rt.can_rewind = True  # greedy replies draft tokens when a step is small
    scheduler = Scheduler(rt, settings, clock=clock)
    turns = [
        begun(rt, None, request(f"{i}:" + "t" * (size - 1), max_tokens=cap, priority=p))
        for i, (_, size, cap, p) in enumerate(workload)
    ]
    index = {id(t._run): i for i, t in enumerate(turns)}
    active: set[int] = set()
    ended: dict[int, float] = {}  # the reference: priority -> when its last turn ended
    done: dict[int, Done] = {}
    steps = []
    for step in range(3000):
        if len(done) == len(turns):
            break
        clock.now += dt[step % len(dt)] if dt else 0.0
        for i, (arrival, *_rest) in enumerate(workload):
            if arrival == step:
                scheduler.add(turns[i])
                active.add(i)
        ended = {p: t for p, t in ended.items() if clock.now - t <= settings.yield_hold_s}
        around = [workload[i][3] for i in active] + list(ended)
        top = min(around, default=0)
        decoding = {i for i in active if turns[i].decoding}
        prompts = [workload[i][3] for i in active - decoding]  # priorities of the prefilling turns
        if not scheduler.busy:
            continue
        for turn, events in scheduler.step():
            for event in events:
                if isinstance(event, Done):
                    i = turns.index(turn)
                    done[i] = event
                    active.discard(i)
                    ended[workload[i][3]] = clock.now
        fed = [(index[run], n) for run, n in zip(rt.runs_per_step[-1], rt.steps[-1], strict=True)]
        steps.append(fed)
        if check is not None:
            check(step, top, [(workload[i][3], n, i in decoding) for i, n in fed], prompts)
    assert len(done) == len(turns), "not every turn finished"
    return steps, {i: (d.token_ids, d.finish_reason) for i, d in done.items()}


@settings(max_examples=30, deadline=None)
@given(
    work=workloads(priorities=[7]),
    max_batch=st.integers(1, 8),
    budget=st.sampled_from([16, 40, 64]),
    yield_budget=st.sampled_from([16, 20, 64]),
    hold=st.sampled_from([0.0, 1.0, 100.0]),
)
def test_with_one_priority_yielding_changes_no_step(work, max_batch, budget, yield_budget, hold):
    reference = drive(work, BatchSettings(max_batch=max_batch, token_budget=budget, yield_budget=0), dt=[0.3])
    yielding = BatchSettings(max_batch=max_batch, token_budget=budget, yield_budget=yield_budget, yield_hold_s=hold)
    assert drive(work, yielding, dt=[0.3]) == reference


@settings(max_examples=40, deadline=None)
@given(
    work=workloads(priorities=[-5, 0, 0, 3]),
    max_batch=st.integers(2, 8),
    budget=st.sampled_from([16, 48, 128]),
    yield_budget=st.sampled_from([2, 5, 16, 24]),
    hold=st.sampled_from([0.0, 0.5, 100.0]),
    dt=st.lists(st.sampled_from([0.0, 0.2, 0.7]), min_size=1, max_size=4),
)
def test_worse_priorities_never_take_more_than_the_yield_budget_and_every_reply_is_its_own(
    work, max_batch, budget, yield_budget, hold, dt
):
    def check(step, top, fed, prompts):
        worse = [(n, decoding) for priority, n, decoding in fed if priority > top]
        assert all(n == 1 for n, decoding in worse if decoding), step  # one token, no drafts
        seats = yield_budget - (yield_budget // 2 if any(p > top for p in prompts) else 0)
        assert sum(1 for _, decoding in worse if decoding) <= seats, step
        assert sum(n for n, _ in worse) <= yield_budget, step

    settings_ = BatchSettings(max_batch=max_batch, token_budget=budget, yield_budget=yield_budget, yield_hold_s=hold)
    _, done = drive(work, settings_, dt=dt, check=check)
    for i, (_, size, cap, priority) in enumerate(work):
        alone_rt = FakeRuntime(script=lambda prompt: "r" * 60)
        alone_rt.can_rewind = True
        want = run_to_end(
            Turn(
                alone_rt,
                None,
                request(f"{i}:" + "t" * (size - 1), max_tokens=cap, priority=priority),
            )
        )[1]
        assert done[i] == (want.token_ids, want.finish_reason)


def longest_wait_of_a_decoder(
    low_priority: int, high_priority: int, per_step: int, steps: int, waiting: Callable[[], int] | None = None
) -> int:
    """A reply of ``low_priority`` decodes while ``per_step`` short turns of ``high_priority`` arrive every step (each
    one's first-token step would leave it out); the most steps it went without a token (interrupted steps count).
    ``waiting``: the scheduler's (steps stop between layers for what it reports)."""
    rt = CountingRuntime(script=lambda prompt: "z" * 2000)
    scheduler = Scheduler(rt, BatchSettings(max_batch=4, token_budget=32, yield_budget=16), waiting=waiting)
    low = begun(rt, None, request("L", max_tokens=1500, priority=low_priority))
    scheduler.add(low)
    while not low.decoding:
        scheduler.step()
    longest, since = 0, 0
    for step in range(steps):
        for i in range(per_step):
            scheduler.add(begun(rt, None, request(f"H{step}.{i}" + "h" * 6, max_tokens=2, priority=high_priority)))
        before = len(low.reply.tokens)
        scheduler.step()
        since = 0 if len(low.reply.tokens) > before else since + 1
        longest = max(longest, since)
    return longest


@settings(max_examples=20, deadline=None)
@given(low=st.integers(-100, 100), gap=st.integers(1, 10), per_step=st.integers(1, 2))
def test_a_yielding_reply_still_gets_a_token_within_the_bound(low, gap, per_step):
    high = max(-100, low - gap)
    window = (low - high) * scheduler_module.AGING_STEPS
    # a seat at least every window + 1 + ceil(decoding / seats) steps: 3 seats, at most 7 replies decoding
    assert longest_wait_of_a_decoder(low, high, per_step, 4 * window + 40) <= window + 1 + 3


def test_without_aging_the_same_stream_would_starve_the_yielding_reply(monkeypatch):
    monkeypatch.setattr(scheduler_module, "AGING_STEPS", 10**6)
    assert longest_wait_of_a_decoder(0, -1, 1, 200) == 200


# ---------------------------------------------------------------- steps interrupted for a better turn


def interruptible(rt, queued: list[int], **settings) -> Scheduler:
    """A scheduler whose steps may stop for a turn queued at priority ``queued[0]`` (``sys.maxsize``: none)."""
    return Scheduler(rt, BatchSettings(**settings), waiting=lambda: queued[0])


def test_a_step_of_worse_turns_stops_for_a_better_turn_and_the_replies_stay_their_own():
    rt, queued = CountingRuntime(script=lambda prompt: "z" * 40), [sys.maxsize]
    scheduler = interruptible(rt, queued)
    batch = [begun(rt, None, request(f"b{i}", max_tokens=30, priority=3)) for i in range(3)]
    for turn in batch:
        scheduler.add(turn)
    while not all(t.decoding for t in batch):
        scheduler.step()
    replies, forwarded = [list(t.reply.tokens) for t in batch], rt.forwarded
    queued[0] = 0  # a chat turn is submitted while the step runs
    assert scheduler.step() == [] and rt.interrupted == 1 and scheduler.last.interrupted
    assert [list(t.reply.tokens) for t in batch] == replies and rt.forwarded == forwarded  # nothing computed
    chat = begun(rt, None, request("hi", max_tokens=3, priority=0))
    scheduler.add(chat)
    queued[0] = sys.maxsize
    scheduler.step()
    assert rt.runs_per_step[-1] == [id(chat._run)]  # the chat's first-token step: the batch sits it out
    done = run_all(scheduler, [*batch, chat], add=False)
    assert rt.interrupted == 1
    asked = [request(f"b{i}", max_tokens=30, priority=3) for i in range(3)] + [request("hi", max_tokens=3)]
    for i, req in enumerate(asked):
        want = run_to_end(Turn(FakeRuntime(script=lambda prompt: "z" * 40), None, req))[1]
        assert done[i].token_ids == want.token_ids and done[i].finish_reason == want.finish_reason


@pytest.mark.parametrize(
    ("queued_priority", "yield_budget", "interrupted"),
    [(2, 16, 1), (3, 16, 0), (5, 16, 0), (2, 0, 0)],
    ids=["better", "equal", "worse", "yielding-off"],
)
def test_only_a_strictly_better_turn_interrupts_and_only_while_yielding_is_on(
    queued_priority, yield_budget, interrupted
):
    rt, queued = CountingRuntime(script=lambda prompt: "z" * 40), [sys.maxsize]
    scheduler = interruptible(rt, queued, yield_budget=yield_budget)
    turns = [begun(rt, None, request(f"b{i}", max_tokens=30, priority=3)) for i in range(2)]
    for turn in turns:
        scheduler.add(turn)
    while not all(t.decoding for t in turns):
        scheduler.step()
    queued[0] = queued_priority
    scheduler.step()
    assert rt.interrupted == interrupted and scheduler.last.interrupted == bool(interrupted)


def test_a_turn_whose_step_was_interrupted_is_not_interrupted_in_its_next_step():
    rt, queued = CountingRuntime(script=lambda prompt: "z" * 40), [sys.maxsize]
    scheduler = interruptible(rt, queued)
    turns = decoding_turns(rt, scheduler, 2, max_tokens=30)
    queued[0] = -1  # a better turn stays queued (say its admission is slow): at most every other step stops
    pattern = []
    for _ in range(6):
        before = len(turns[0].reply.tokens)
        scheduler.step()
        pattern.append((scheduler.last.interrupted, len(turns[0].reply.tokens) - before))
    assert pattern == [(True, 0), (False, 1)] * 3


def test_an_interrupted_step_leaves_the_seats_to_the_turns_it_held():
    """Round-robin resumes as if the interrupted step had not been planned: the turns it seated sit next."""
    rt, queued = CountingRuntime(script=lambda prompt: "z" * 40), [sys.maxsize]
    scheduler = interruptible(rt, queued, max_batch=2)
    decoding_turns(rt, scheduler, 4, max_tokens=30)
    scheduler.step()
    queued[0] = -1
    scheduler.step()
    interrupted = rt.runs_per_step[-1]
    queued[0] = sys.maxsize
    scheduler.step()
    assert scheduler.last.interrupted is False and rt.runs_per_step[-1] == interrupted


@settings(max_examples=20, deadline=None)
@given(low=st.integers(-100, 100), gap=st.integers(1, 10), per_step=st.integers(1, 2))
def test_with_every_step_it_can_interrupt_stopped_a_yielding_reply_still_gets_a_token_within_twice_the_bound(
    low, gap, per_step
):
    high = max(-100, low - gap)
    window = (low - high) * scheduler_module.AGING_STEPS
    longest = longest_wait_of_a_decoder(low, high, per_step, 4 * window + 40, waiting=lambda: -1000)
    assert longest <= 2 * (window + 1 + 3)


def test_a_reply_as_good_as_the_waiting_turn_loses_its_token_for_a_step_but_a_prompt_as_good_is_not_held_up():
    rt, queued = CountingRuntime(script=lambda prompt: "z" * 40), [sys.maxsize]
    scheduler = interruptible(rt, queued, token_budget=32)
    batch = [begun(rt, None, request(f"b{i}", max_tokens=30, priority=3)) for i in range(2)]
    chat = begun(rt, None, request("c", max_tokens=30, priority=0))
    for turn in (*batch, chat):
        scheduler.add(turn)
    while not all(t.decoding for t in (*batch, chat)):
        scheduler.step()
    queued[0] = 0  # another chat turn: the chat reply's step (with the batch's work) stops
    before = len(chat.reply.tokens)
    scheduler.step()
    assert scheduler.last.interrupted and len(chat.reply.tokens) == before
    queued[0] = sys.maxsize
    scheduler.step()  # the next step is not interrupted: the chat reply gets its token
    assert not scheduler.last.interrupted and len(chat.reply.tokens) == before + 1
    prompt = begun(rt, None, request("a long chat question " + "q" * 200, max_tokens=5, priority=0))
    scheduler.add(prompt)
    queued[0] = 0  # as good as the chat prompt of the step: not interrupted
    scheduler.step()
    assert not scheduler.last.interrupted and not prompt.decoding and id(prompt._run) in rt.runs_per_step[-1]
    queued[0] = -1  # better than it: interrupted
    scheduler.step()
    assert scheduler.last.interrupted
