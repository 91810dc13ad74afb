"""The scheduler: what every active turn computes in the next step, and one batched forward that computes it.

**A step** is one call of the runtime's ``forward_batch`` over the feeds of many turns at once:

1. Cancelled turns end first (what they computed is stored; their Done goes out), so a cancel takes effect within
   one step and nothing of theirs enters the forward.
2. Every decoding turn feeds its next token, up to ``max_batch`` turns (one seat is kept for a waiting prefill).
   When more turns decode than fit, they take seats by rank (see *Priorities and fairness*): with equal
   priorities round-robin, each getting a token at least every ``ceil(decoding / seats)`` steps. Turns of a worse
   priority than one around take fewer seats (see *Yielding*).
3. Prefilling turns share what is left of ``token_budget`` by rank (oldest first among equal priorities), each a
   chunk of its prompt (a chunk also ends where a recurrent snapshot is wanted). The first waiting prefill always
   gets at least :data:`MIN_PREFILL_CHUNK` tokens (unless it yields: then its share of the yield budget), even when
   decode tokens took the whole budget, so a long prompt keeps moving and never stalls the decoding turns for more
   than one chunk per step. A new turn whose prompt
   shares at least :data:`SHARE_MIN` uncached tokens (and a quarter of what it has to compute) with a turn ranked
   ahead of it and still prefilling waits for that turn: once that one has stored its prompt, the new one looks the
   cache up again and computes only what is its own (see *Prefixes shared in flight*).
4. Speculative drafts (greedy replies on models that can rewind) ride along only in small steps: at most
   :data:`SPECULATE_UP_TO` decoding turns and no prefill. A draft token is nearly free when a forward is bound by
   reading the weights (one or two rows), and pure waste when the forward already has many rows.

**Budgets.** ``max_batch`` bounds the turns in one forward (per-turn attention and sampling cost grow with it);
``token_budget`` bounds the tokens (it is the step time of the biggest prefill chunk, hence how long decoding turns
wait for their next token while a long prompt is prefilled). Defaults were chosen by measurement (see
docs/benchmarks.md); both are settings (``--max-batch``, ``--token-budget``).

**Prefixes shared in flight.** Sessions of one application start with the same system prompt; when many arrive together,
none finds it in the cache yet. Computing it once per turn multiplies the prefill work; instead a fresh turn (nothing
computed but what the cache gave) follows the prefilling turn ranked ahead of it that it shares the most with (one that
does not wait itself: followers of one leader all go on after one step), and sits out while that one prefills. Prefills
are served by rank, so what a follower gives up is only the budget its leader leaves over in those steps; what it saves
is every shared token. A turn follows at most once: when its leader has stored its prompt (or ended in any way) it looks
again (:meth:`chat.engine.turn.Turn.look_again`) and goes on from the longest prefix it finds. Only runtimes without
recurrent layers (any prefix of a stored prompt can be restored) and only within a namespace (same weights, dtype and
tenant), as the cache itself shares.

**Grammar masks off the critical path.** A constrained turn's next mask depends only on the tokens it has, so the masks
of every constrained turn of a step are computed (in llguidance's threads, without the GIL) while the forward runs
(:class:`chat.engine.constraints.MaskBatch`); sampling then only applies them.

**Priorities and fairness.** Every turn has a priority (``SamplingParams.priority``, vLLM's field: an integer in
[-100, 100], lower is served sooner; None counts as 0). Prefills are served in order of *rank*, and decoding turns
take the seats in order of rank when more decode than fit; among equal priorities the order is first come, first
served (prefills) and round-robin (seats), and new turns join at the next step.

*A better priority's prompt gets a short step*: a prefill ranked after a prefill of better priority in the same step
sits that step out, even when budget is left; and a decoding turn ranked after a prefill of better priority sits out
the step that computes that prefill's last chunk (the one that gives its first token). So the step that computes an
interactive turn's prompt and first token costs what that prompt costs, not a full ``token_budget`` of batch prompts
(or a row per batch reply) riding along; the worse ones go on at the next step. The first prefill of a step, by
rank, is never left out, so the bound below holds.

*Yielding*: a turn that arrives waits for the step in flight (unless that step stops for it: *Interrupted steps*,
below), and a full ``token_budget`` of batch prompts costs several times an interactive turn's own step, so what the
step in flight holds matters as much as what the turn's own step holds. While a better priority is *around* — a turn
of it is active, or one ended less than ``yield_hold_s`` seconds ago (its user reading the reply and writing the
next question) — the turns of every worse priority share ``yield_budget`` tokens per step, no more: their decoding
turns one token each (no drafts), by rank, up to ``yield_budget - yield_budget // 2`` of them while a worse prompt
waits (all of it otherwise), then their prefills what is left (at least ``yield_budget // 2``, so the prompts keep
moving; the least prefill chunk does not apply to them). A step then holds at most ``yield_budget`` tokens of worse
priorities, so a better turn that arrives waits for a short step, and its own decoding is not slowed by full batch
steps either. What that wait is worth was measured (bench tenants, docs/benchmarks.md): the better turn's own
first-token step holds the same work alone and under load, and what scheduling adds under load is about half a step
in flight. A step's cost is a fixed part (weights, per-layer work: most of a short step) and a part per token, so a
smaller budget shortens that wait less than in proportion, while the worse priorities' throughput falls faster: each
step pays the fixed cost for fewer of their tokens. Turns of the best priority around, and every turn when all have
one priority, are not affected. ``yield_budget`` 0 turns yielding off; settings ``--yield-budget`` (default
:data:`DEFAULT_YIELD_BUDGET`; at least 2: a token for the worse replies and one for their prompts) and
``--yield-hold-s`` (default :data:`DEFAULT_YIELD_HOLD_S`; 0: only while a better turn is active).

*Interrupted steps*: the engine tells the scheduler the best priority of the turns submitted and not yet added
(``waiting``). The forward asks it between layers (a runtime whose forward can stop there: turncache's own decoder;
transformers' forward never stops) and stops when a waiting turn is better than some turn of the step and than every
prompt in it: every run is rolled back, every feed withdrawn and the ranks planning gave put back, so the step never
happened; the engine adds the new turn and the next step is its prompt's (which leaves the worse turns out, above).
So a better turn waits for one layer of the step in flight (about 1 ms for the built-in model), not half a step. A
decoding turn as good as the new one loses that step's token (it joins the new turn's step); a prompt as good is
never held up. A turn whose step was interrupted is not interrupted in its next step: interruptions lose at most every
other step of a turn, and at most double the steps a turn waits for a token (the bound below, interrupted steps
counted). Only while yielding is on (``yield_budget`` > 0).

*Aging rule*: a waiting turn's priority improves by one every :data:`AGING_STEPS` steps. The rank of a decoding turn
is ``priority * AGING_STEPS + the step it last had a seat``; the rank of a prefill is ``priority * AGING_STEPS + the
step it arrived at or, if later, the last step a prefill of its priority got a chunk`` (smaller goes first; ties: who
came first). Counting from the last chunk its priority got (not from its arrival) keeps prefills that wait only for
their own priority's older turns, as they do while yielding, from overtaking every new turn of a better priority;
prefills of a priority that gets nothing age as before. So a turn of priority ``p`` goes after a turn of priority
``q < p`` only if that one arrived less than ``(p - q) * AGING_STEPS`` steps after turns of priority ``p`` last got
work (a decoding turn: after it last sat): only turns arriving within ``(p - q_min) * AGING_STEPS`` steps of that
can overtake them, and at most 200 x 4 = 800 steps' worth of arrivals ever can. A decoding turn gets a seat at least
every ``(p - q_min) * AGING_STEPS + 1 + ceil(decoding / seats)`` steps (``seats``: at most ``yield_budget`` while it
yields, ``yield_budget - yield_budget // 2`` while a worse prompt waits too), and the yielding prompts get at least
``yield_budget // 2`` tokens in every step without a better prompt in it. Nothing starves, however many turns of
higher priority keep coming (``tests/chat/engine/test_scheduler.py``).

**Paused turns.** A decoding turn whose client has fallen behind reading its stream is paused by the server
(:meth:`chat.engine.turn.Turn.pause`, ``chat.server.transport.backpressure``): it takes no seat, computes nothing and
keeps its state and rank until it goes on (then it is seated first) or is cancelled (a step ends it, paused or not).
So a client that stops reading costs the other turns nothing but the memory its state holds. :attr:`Scheduler.ready`
is false while only paused turns are active; the engine then waits until one goes on or ends.

**Failure isolation.** The runtime reports an error per feed: a feed that fails alone ends only its own turn
(finish_reason "error", nothing stored); when a batched forward fails, the runtime rolls every run back and runs each
feed alone, so the others produce the same tokens they would have produced without the failing turn. If the runtime
itself raises (a bug), every turn of that step fails and the engine goes on with the next step.

Not thread-safe: the engine's worker thread owns it (a turn's ``cancel`` may come from any thread).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from chat.engine.constraints import MaskBatch
from chat.engine.errors import InvalidBatchSettingError
from chat.engine.events import Event
from chat.engine.runtime import Feed, ModelRuntime, StepInterrupted
from chat.engine.turn import DRAFT_TOKENS, Turn

DEFAULT_MAX_BATCH = 32  # turns in one forward
DEFAULT_TOKEN_BUDGET = 256  # tokens in one forward
MAX_BATCH_RANGE = (1, 256)
TOKEN_BUDGET_RANGE = (16, 8192)
DRAFT_TOKENS_RANGE = (0, 16)
MIN_PREFILL_CHUNK = 16  # a waiting prefill gets at least this many tokens per step
SPECULATE_UP_TO = 2  # most decoding turns in a step that still carries draft tokens
SHARE_MIN = 16  # a fresh turn waits for an older prefilling turn only to share at least this many new tokens
AGING_STEPS = 4  # a waiting turn's priority improves by one every this many steps (see Priorities and fairness)
DEFAULT_YIELD_BUDGET = 16  # tokens per step of worse priorities while a better one is around (see Yielding); 0: off
DEFAULT_YIELD_HOLD_S = 10.0  # seconds a priority stays around after its last turn ended
YIELD_BUDGET_RANGE = (2, 8192)  # or 0: off (2: a token for the worse replies and one for their prompts)
YIELD_HOLD_RANGE = (0.0, 3600.0)


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How much one step may hold. Raises :class:`InvalidBatchSettingError` (naming the setting) when out of range."""

    max_batch: int = DEFAULT_MAX_BATCH  # most turns in one forward
    token_budget: int = DEFAULT_TOKEN_BUDGET  # most tokens in one forward (but see MIN_PREFILL_CHUNK)
    draft_tokens: int = DRAFT_TOKENS  # most draft tokens a greedy reply verifies per step; 0: no speculation
    yield_budget: int = DEFAULT_YIELD_BUDGET  # tokens per step of worse priorities while a better one is around; 0: off
    yield_hold_s: float = DEFAULT_YIELD_HOLD_S  # how long a priority stays around after its last turn ended

    def __post_init__(self) -> None:
        for name, (low, high) in (
            ("max_batch", MAX_BATCH_RANGE),
            ("token_budget", TOKEN_BUDGET_RANGE),
            ("draft_tokens", DRAFT_TOKENS_RANGE),
            ("yield_budget", YIELD_BUDGET_RANGE),
        ):
            value = getattr(self, name)
            off = name == "yield_budget" and value == 0
            if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high or off):
                either = " or 0 (off)" if name == "yield_budget" else ""
                raise InvalidBatchSettingError(name, f"must be an integer in [{low}, {high}]{either}, got {value!r}")
        low, high = YIELD_HOLD_RANGE
        hold = self.yield_hold_s
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not low <= hold <= high:
            raise InvalidBatchSettingError(
                "yield_hold_s", f"must be a number of seconds in [{low}, {high}], got {hold!r}"
            )


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step did (for metrics)."""

    turns: int  # turns whose feed went into the forward
    tokens: int  # tokens in the forward
    prefills: int  # of the turns, those prefilling
    interrupted: bool = False  # the forward stopped midway for a better turn (see Yielding): nothing was computed


class Scheduler:
    """Active turns and the step that advances them. Add begun turns with :meth:`add`; call :meth:`step` while
    :attr:`busy`."""

    def __init__(
        self,
        runtime: ModelRuntime,
        settings: BatchSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        waiting: Callable[[], int] | None = None,
    ) -> None:
        """``waiting``: the best (lowest) priority of the turns submitted but not yet added, ``sys.maxsize`` when
        there is none (the engine's; asked between layers of a step that may be interrupted, see Yielding). None:
        steps are never interrupted."""
        self.runtime = runtime  # the model every turn runs on
        self.settings = settings or BatchSettings()
        self.clock = clock  # seconds, for the yield hold (tests give their own)
        self.waiting = waiting
        self._interrupted: set[Turn] = set()  # turns whose last planned step was interrupted (not again: Yielding)
        self._ended: dict[int, float] = {}  # priority -> when its last turn ended (within the yield hold)
        self._decoding: list[Turn] = []  # decoding turns, in the order they joined
        self._prefilling: list[Turn] = []  # prefilling turns, by rank (see Priorities and fairness)
        self._rank: dict[Turn, tuple[int, int]] = {}  # every turn -> (rank, arrival number): smaller goes first
        self._now = 0  # steps run so far: the clock of the aging rule
        self._served: dict[int, int] = {}  # priority -> the last step a prefill of that priority got a chunk
        self._arrivals = itertools.count()  # breaks ties of rank: who came (or sat) first
        self._leaders: dict[Turn, Turn | None] = {}  # prefilling turn -> the older turn it waits for (None: none)
        self.last: StepReport | None = None  # what the latest step did
        self._masks: MaskBatch | None = None  # fills grammar masks during the forward (made at the first grammar)

    @property
    def busy(self) -> bool:
        return bool(self._decoding or self._prefilling)

    @property
    def ready(self) -> bool:
        """Whether a step would do anything: a turn prefills, decodes unpaused, or was cancelled (a step ends it).
        False while every active turn is a paused decoding turn (the engine then waits to be woken)."""
        return bool(self._prefilling) or any(not t.paused or t.cancelled for t in self._decoding)

    @property
    def active(self) -> int:
        return len(self._decoding) + len(self._prefilling)

    def turns(self) -> list[Turn]:
        return [*self._prefilling, *self._decoding]

    def add(self, turn: Turn) -> None:
        """Take a begun turn; it joins the next step, placed by its priority (see Priorities and fairness)."""
        self._stamp(turn)
        if turn.decoding:
            self._decoding.append(turn)
        else:
            self._prefilling.append(turn)
            self._prefilling.sort(key=self._prefill_rank)  # stable: equal ranks keep their arrival order

    def step(self) -> list[tuple[Turn, list[Event]]]:
        """Run one step (see the module docstring); return each affected turn's events."""
        self._now += 1
        results: list[tuple[Turn, list[Event]]] = []
        for turn in [t for t in self.turns() if t.cancelled]:
            self._remove(turn)
            results.append((turn, turn.stop("cancelled")))
        ranks, served = dict(self._rank), dict(self._served)  # what planning changes, put back if interrupted
        plan = self._plan()
        self.last = StepReport(len(plan), sum(len(f.tokens) for _, f in plan), sum(not t.decoding for t, _ in plan))
        if not plan:
            return results
        constraints = [c for turn, _ in plan if (c := turn.pending_constraint()) is not None]
        if constraints and self._masks is None:
            self._masks = MaskBatch()
        pending = self._masks.start(constraints) if self._masks is not None else None
        try:
            outcomes = self.runtime.forward_batch([feed for _, feed in plan], self._interrupt_for(plan))
            if len(outcomes) != len(plan):
                raise RuntimeError(f"the runtime returned {len(outcomes)} results for {len(plan)} feeds")
        except StepInterrupted:  # a better turn came: nothing was computed; plan again once it is added
            if self._masks is not None:
                self._masks.wait(pending)
            for turn, _ in plan:
                turn.withdraw()
                self._rank[turn] = ranks[turn]
                self._interrupted.add(turn)
            self._served = served
            self.last = StepReport(self.last.turns, self.last.tokens, self.last.prefills, interrupted=True)
            return results
        except Exception as exc:  # a runtime bug: every turn of this step fails, the engine goes on
            outcomes = [exc] * len(plan)
        if self._masks is not None:
            self._masks.wait(pending)  # a mask that failed to fill is computed again when it is used
        self._interrupted.difference_update(turn for turn, _ in plan)
        for (turn, _), outcome in zip(plan, outcomes, strict=True):
            was_decoding = turn.decoding
            events = turn.fail(outcome) if isinstance(outcome, Exception) else turn.absorb(outcome)
            results.append((turn, events))
            if turn.done:
                self._remove(turn)
            elif turn.decoding and not was_decoding:  # the prompt is absorbed: join the decoding turns
                self._prefilling.remove(turn)
                self._leaders.pop(turn, None)
                self._stamp(turn)
                self._decoding.append(turn)
        return results

    def stop_all(self) -> list[tuple[Turn, list[Event]]]:
        """End every active turn now ("cancelled"), storing what was computed."""
        out = [(turn, turn.stop("cancelled")) for turn in self.turns()]
        self._decoding.clear()
        self._prefilling.clear()
        self._leaders.clear()
        self._rank.clear()
        self._ended.clear()
        self._served.clear()
        self._interrupted.clear()
        return out

    # ---------------------------------------------------------------- internals

    def _plan(self) -> list[tuple[Turn, Feed]]:
        """The feeds of the next forward: decode seats first, then prefill chunks."""
        s = self.settings
        top = self._top_priority() if s.yield_budget else sys.maxsize  # worse priorities yield; off: none is worse
        seats = s.max_batch - (1 if self._prefilling else 0)  # one seat kept for the oldest waiting prefill
        rows = s.yield_budget  # worse decoding turns seated; half the yield budget kept for worse prompts (Yielding)
        if any(priority_of(t) > top for t in self._prefilling):
            rows -= s.yield_budget // 2
        decoders = self._seat(max(seats, 0), top, rows)
        worse = sum(priority_of(t) > top for t in decoders)  # each takes one token of the yield budget
        prefills = self._plan_prefills(s.token_budget - len(decoders), s.max_batch - len(decoders), top, worse)
        firsts = [(*self._prefill_rank(t), priority_of(t)) for t, _ in prefills if t.pending_ends_prompt]
        drafts = len(decoders) <= SPECULATE_UP_TO and not self._prefilling  # so 1 token each when a prefill waits
        budget = s.token_budget
        plan: list[tuple[Turn, Feed]] = []
        for turn in decoders:
            rank, priority = self._rank[turn], priority_of(turn)
            if any(p < priority and (r, n) < rank for r, n, p in firsts):
                continue  # ranked after a better priority whose first token this step computes: sits it out
            self._stamp(turn)
            room = max(1, budget - len(decoders) + 1) if priority <= top else 1  # no drafts while yielding
            feed = turn.next_feed(room, drafts=drafts)
            budget -= len(feed.tokens)
            plan.append((turn, feed))
        return plan + prefills

    def _interrupt_for(self, plan: list[tuple[Turn, Feed]]) -> Callable[[], bool] | None:
        """What the forward of ``plan`` asks between layers: whether a turn is waiting to be added whose priority is
        better than some turn's of the plan and better than every prefill's of the plan (a decoding turn as good as
        the newcomer only loses this step's token; a prompt as good is never held up). None (never interrupted)
        when yielding is off, nobody reports waiting turns, or a turn of the plan had its last step interrupted
        (see Yielding)."""
        if (
            not self.settings.yield_budget
            or self.waiting is None
            or not self._interrupted.isdisjoint(turn for turn, _ in plan)
        ):
            return None
        worst = max(priority_of(turn) for turn, _ in plan)
        prompts = min((priority_of(turn) for turn, _ in plan if not turn.decoding), default=sys.maxsize)
        bar, waiting = min(worst, prompts), self.waiting
        return lambda: waiting() < bar

    def _seat(self, seats: int, top: int, cap: int) -> list[Turn]:
        """Up to ``seats`` decoding turns, by rank, of which at most ``cap`` of priority worse than ``top`` (each one
        seated ranks again from this step: with equal priorities, round-robin). Paused turns take no seat (they keep
        their rank, so they are seated first once they go on)."""
        decoding = [t for t in self._decoding if not t.paused]
        if len(decoding) <= seats and sum(priority_of(t) > top for t in decoding) <= cap:
            return decoding
        taken: list[Turn] = []
        for turn in sorted(decoding, key=self._rank.__getitem__):
            if len(taken) == seats:
                break
            if priority_of(turn) > top:
                if cap == 0:
                    continue
                cap -= 1
            taken.append(turn)
        return taken

    def _plan_prefills(self, budget: int, room: int, top: int, worse: int) -> list[tuple[Turn, Feed]]:
        """Prefill chunks of at most ``budget`` tokens in all for at most ``room`` turns, by rank; those of priority
        worse than ``top`` share what ``worse`` decode tokens left of the yield budget (see Priorities and fairness,
        Yielding)."""
        plan: list[tuple[Turn, Feed]] = []
        lead: int | None = None  # the best priority among this step's prefills so far
        yield_left = self.settings.yield_budget - worse  # tokens left this step for priorities worse than top
        self._prefilling.sort(key=self._prefill_rank)  # ranks move as priorities are served (stable)
        for turn in self._prefilling:
            if len(plan) >= room:
                break
            if self._waits(turn):
                continue
            priority = priority_of(turn)
            if lead is not None and priority > lead:
                continue  # ranked after a prefill of better priority: sits this step out (Priorities and fairness)
            first = turn is self._prefilling[0]
            give = max(budget, MIN_PREFILL_CHUNK) if first else budget
            if give <= 0:
                break
            yields = priority > top
            if yields:
                give = min(give, yield_left)  # no least chunk: the yield budget bounds the step (Yielding)
                if give <= 0:
                    continue  # the worse priorities' share of this step is spent; a better one may still come
            feed = turn.next_feed(give)
            budget -= len(feed.tokens)
            if yields:
                yield_left -= len(feed.tokens)
            plan.append((turn, feed))
            lead = priority if lead is None else min(lead, priority)
        for turn, _ in plan:
            self._served[priority_of(turn)] = self._now
        return plan

    def _prefill_rank(self, turn: Turn) -> tuple[int, int]:
        """A prefill's rank: ``priority * AGING_STEPS`` + the step it arrived at or, if later, the last step a
        prefill of its priority got a chunk (see Priorities and fairness); ties: who came first."""
        arrived, number = self._rank[turn]
        priority = priority_of(turn)
        return max(arrived, priority * AGING_STEPS + self._served.get(priority, 0)), number

    def _top_priority(self) -> int:
        """The best (lowest) priority around: of an active turn, or of a turn that ended less than ``yield_hold_s``
        ago (see Yielding)."""
        now, hold = self.clock(), self.settings.yield_hold_s
        for priority in [p for p, ended in self._ended.items() if now - ended > hold]:
            del self._ended[priority]
        around = [priority_of(t) for t in self._prefilling] + [priority_of(t) for t in self._decoding]
        return min(around + list(self._ended), default=0)

    def _waits(self, turn: Turn) -> bool:
        """True while ``turn`` sits out for an older prefilling turn that computes a prefix the two share (decided
        the first time the turn is planned). When that leader is no longer prefilling, the turn looks the cache up
        again and stops waiting."""
        if turn not in self._leaders:
            self._leaders[turn] = self._leader_of(turn)
        leader = self._leaders[turn]
        if leader is None:
            return False
        if leader in self._prefilling:
            return True
        self._leaders[turn] = None
        if turn.fresh:
            turn.look_again()
        return False

    def _leader_of(self, turn: Turn) -> Turn | None:
        """The older prefilling turn whose stored prompt would spare ``turn`` the most work, if worth waiting for."""
        if not turn.reuses_cache or self.runtime.has_recurrent_state or not turn.fresh:
            return None
        best, shared = None, 0
        for other in self._prefilling:
            if other is turn:
                break
            if self._leaders.get(other) is not None:  # a follower itself: a longer wait for a few tokens more
                continue
            n = turn.shared_prefix(other)
            if n > shared:
                best, shared = other, n
        gain, own = shared - turn.cached_tokens, len(turn.prompt) - turn.cached_tokens
        return best if gain >= SHARE_MIN and 4 * gain >= own else None

    def _stamp(self, turn: Turn) -> None:
        """Rank ``turn`` from now: ``priority * AGING_STEPS + now`` (see Priorities and fairness)."""
        self._rank[turn] = (priority_of(turn) * AGING_STEPS + self._now, next(self._arrivals))

    def _remove(self, turn: Turn) -> None:
        self._ended[priority_of(turn)] = self.clock()
        self._interrupted.discard(turn)
        self._leaders.pop(turn, None)
        self._rank.pop(turn, None)
        if turn in self._prefilling:
            self._prefilling.remove(turn)
        elif turn in self._decoding:
            self._decoding.remove(turn)


def priority_of(turn: Turn) -> int:
    """The turn's own priority (None counts as 0), without aging."""
    return turn.request.params.priority or 0
