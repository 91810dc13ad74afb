"""The scheduler: what every active turn computes in the next step, and one batched forward that computes it.

**A step** is one call of the runtime's ``forward_batch`` over the feeds of many turns at once:

1. Cancelled turns end first (what they computed is stored; their Done goes out), so a cancel takes effect within
   one step and nothing of theirs enters the forward.
2. Every decoding turn feeds its next token, up to ``max_batch`` turns (one seat is kept for a waiting prefill).
   When more turns decode than fit, they take seats by rank (see *Priorities and fairness*): with equal
   priorities round-robin, each getting a token at least every ``ceil(decoding / seats)`` steps.
3. Prefilling turns share what is left of ``token_budget`` by rank (oldest first among equal priorities), each a
   chunk of its prompt (a chunk also ends where a recurrent snapshot is wanted). The first waiting prefill always
   gets at least :data:`MIN_PREFILL_CHUNK` tokens, even when decode tokens took the whole budget, so a long prompt
   keeps moving and never stalls the decoding turns for more than one chunk per step. A new turn whose prompt
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

*A better priority's prefill keeps its step short*: a prefill ranked after a prefill of better priority in the same
step sits that step out, even when budget is left, so the step that computes an interactive turn's prompt (and its
first token) costs what that prompt costs, not a full ``token_budget`` of batch prompts riding along; the worse ones
go on at the next step. The first prefill of a step, by rank, is never left out, so the bound below holds.

*Aging rule*: a waiting turn's priority improves by one every :data:`AGING_STEPS` steps. So the rank of a prefill is
``priority * AGING_STEPS + the step it arrived at`` and the rank of a decoding turn is
``priority * AGING_STEPS + the step it last had a seat`` (smaller goes first; ties: who came first). A turn of
priority ``p`` therefore goes after a turn of priority ``q < p`` only if that one arrived (or last sat) less than
``(p - q) * AGING_STEPS`` steps after it: only turns arriving within ``(p - q_min) * AGING_STEPS`` steps of it can
overtake it, and at most 200 x 4 = 800 steps' worth of arrivals ever can. A decoding turn gets a seat at least every
``(p - q_min) * AGING_STEPS + ceil(decoding / seats)`` steps. Nothing starves, however many turns of higher priority
keep coming (``tests/chat/engine/test_scheduler.py``).

**Failure isolation.** The runtime reports an error per feed: a feed that fails alone ends only its own turn
(finish_reason "error", nothing stored); when a batched forward fails, the runtime rolls every run back and runs each
feed alone, so the others produce the same tokens they would have produced without the failing turn. If the runtime
itself raises (a bug), every turn of that step fails and the engine goes on with the next step.

Not thread-safe: the engine's worker thread owns it (a turn's ``cancel`` may come from any thread).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from chat.engine.constraints import MaskBatch
from chat.engine.errors import InvalidBatchSettingError
from chat.engine.events import Event
from chat.engine.runtime import Feed, ModelRuntime
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


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How much one step may hold. Raises :class:`InvalidBatchSettingError` (naming the setting) when out of range."""

    max_batch: int = DEFAULT_MAX_BATCH  # most turns in one forward
    token_budget: int = DEFAULT_TOKEN_BUDGET  # most tokens in one forward (but see MIN_PREFILL_CHUNK)
    draft_tokens: int = DRAFT_TOKENS  # most draft tokens a greedy reply verifies per step; 0: no speculation

    def __post_init__(self) -> None:
        for name, (low, high) in (
            ("max_batch", MAX_BATCH_RANGE),
            ("token_budget", TOKEN_BUDGET_RANGE),
            ("draft_tokens", DRAFT_TOKENS_RANGE),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidBatchSettingError(name, f"must be an integer in [{low}, {high}], got {value!r}")


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step did (for metrics)."""

    turns: int  # turns whose feed went into the forward
    tokens: int  # tokens in the forward
    prefills: int  # of the turns, those prefilling


class Scheduler:
    """Active turns and the step that advances them. Add begun turns with :meth:`add`; call :meth:`step` while
    :attr:`busy`."""

    def __init__(self, runtime: ModelRuntime, settings: BatchSettings | None = None) -> None:
        self.runtime = runtime  # the model every turn runs on
        self.settings = settings or BatchSettings()
        self._decoding: list[Turn] = []  # decoding turns, in the order they joined
        self._prefilling: list[Turn] = []  # prefilling turns, by rank (see Priorities and fairness)
        self._rank: dict[Turn, tuple[int, int]] = {}  # every turn -> (rank, arrival number): smaller goes first
        self._now = 0  # steps run so far: the clock of the aging rule
        self._arrivals = itertools.count()  # breaks ties of rank: who came (or sat) first
        self._leaders: dict[Turn, Turn | None] = {}  # prefilling turn -> the older turn it waits for (None: none)
        self.last: StepReport | None = None  # what the latest step did
        self._masks: MaskBatch | None = None  # fills grammar masks during the forward (made at the first grammar)

    @property
    def busy(self) -> bool:
        return bool(self._decoding or self._prefilling)

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
            self._prefilling.sort(key=self._rank.__getitem__)  # stable: equal ranks keep their arrival order

    def step(self) -> list[tuple[Turn, list[Event]]]:
        """Run one step (see the module docstring); return each affected turn's events."""
        self._now += 1
        results: list[tuple[Turn, list[Event]]] = []
        for turn in [t for t in self.turns() if t.cancelled]:
            self._remove(turn)
            results.append((turn, turn.stop("cancelled")))
        plan = self._plan()
        self.last = StepReport(len(plan), sum(len(f.tokens) for _, f in plan), sum(not t.decoding for t, _ in plan))
        if not plan:
            return results
        constraints = [c for turn, _ in plan if (c := turn.pending_constraint()) is not None]
        if constraints and self._masks is None:
            self._masks = MaskBatch()
        pending = self._masks.start(constraints) if self._masks is not None else None
        try:
            outcomes = self.runtime.forward_batch([feed for _, feed in plan])
            if len(outcomes) != len(plan):
                raise RuntimeError(f"the runtime returned {len(outcomes)} results for {len(plan)} feeds")
        except Exception as exc:  # a runtime bug: every turn of this step fails, the engine goes on
            outcomes = [exc] * len(plan)
        if self._masks is not None:
            self._masks.wait(pending)  # a mask that failed to fill is computed again when it is used
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
        return out

    # ---------------------------------------------------------------- internals

    def _plan(self) -> list[tuple[Turn, Feed]]:
        """The feeds of the next forward: decode seats first, then prefill chunks."""
        s = self.settings
        seats = s.max_batch - (1 if self._prefilling else 0)  # one seat kept for the oldest waiting prefill
        decoders = self._take_decoders(max(seats, 0))
        drafts = len(decoders) <= SPECULATE_UP_TO and not self._prefilling
        budget = s.token_budget
        plan: list[tuple[Turn, Feed]] = []
        for turn in decoders:
            feed = turn.next_feed(max(1, budget - len(decoders) + 1), drafts=drafts)
            budget -= len(feed.tokens)
            plan.append((turn, feed))
        lead: int | None = None  # the best priority among this step's prefills so far
        for turn in self._prefilling:
            if len(plan) >= s.max_batch:
                break
            if self._waits(turn):
                continue
            priority = turn.request.params.priority or 0
            if lead is not None and priority > lead:
                continue  # ranked after a prefill of better priority: sits this step out (Priorities and fairness)
            give = max(budget, MIN_PREFILL_CHUNK) if turn is self._prefilling[0] else budget
            if give <= 0:
                break
            feed = turn.next_feed(give)
            budget -= len(feed.tokens)
            plan.append((turn, feed))
            lead = priority if lead is None else min(lead, priority)
        return plan

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

    def _take_decoders(self, seats: int) -> Sequence[Turn]:
        """Up to ``seats`` decoding turns, by rank; each one taken ranks again from this step (with equal
        priorities: round-robin)."""
        if len(self._decoding) <= seats:
            taken = list(self._decoding)
        else:
            taken = sorted(self._decoding, key=self._rank.__getitem__)[:seats]
        for turn in taken:
            self._stamp(turn)
        return taken

    def _stamp(self, turn: Turn) -> None:
        """Rank ``turn`` from now: ``priority * AGING_STEPS + now`` (see Priorities and fairness)."""
        priority = turn.request.params.priority or 0
        self._rank[turn] = (priority * AGING_STEPS + self._now, next(self._arrivals))

    def _remove(self, turn: Turn) -> None:
        self._leaders.pop(turn, None)
        self._rank.pop(turn, None)
        if turn in self._prefilling:
            self._prefilling.remove(turn)
        elif turn in self._decoding:
            self._decoding.remove(turn)
