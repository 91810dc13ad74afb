"""The scheduler: what every active turn computes in the next step, and one batched forward that computes it.

**A step** is one call of the runtime's ``forward_batch`` over the feeds of many turns at once:

1. Cancelled turns end first (what they computed is stored; their Done goes out), so a cancel takes effect within
   one step and nothing of theirs enters the forward.
2. Every decoding turn feeds its next token, up to ``max_batch`` turns (one seat is kept for a waiting prefill).
   When more turns decode than fit, they take seats round-robin: each gets a token at least every
   ``ceil(decoding / seats)`` steps.
3. Prefilling turns share what is left of ``token_budget``, oldest first, each a chunk of its prompt (a chunk also
   ends where a recurrent snapshot is wanted). The oldest waiting prefill always gets at least
   :data:`MIN_PREFILL_CHUNK` tokens, even when decode tokens took the whole budget, so a long prompt keeps moving
   and never stalls the decoding turns for more than one chunk per step.
   A new turn whose prompt shares at least :data:`SHARE_MIN` uncached tokens (and a quarter of what it has to
   compute) with an older turn still prefilling waits for that turn: once the older one has stored its prompt, the
   new one looks the cache up again and computes only what is its own (see *Prefixes shared in flight*).
4. Speculative drafts (greedy replies on models that can rewind) ride along only in small steps: at most
   :data:`SPECULATE_UP_TO` decoding turns and no prefill. A draft token is nearly free when a forward is bound by
   reading the weights (one or two rows), and pure waste when the forward already has many rows.

**Budgets.** ``max_batch`` bounds the turns in one forward (per-turn attention and sampling cost grow with it);
``token_budget`` bounds the tokens (it is the step time of the biggest prefill chunk, hence how long decoding turns
wait for their next token while a long prompt is prefilled). Defaults were chosen by measurement (see
docs/benchmarks.md); both are settings (``--max-batch``, ``--token-budget``).

**Prefixes shared in flight.** Sessions of one application start with the same system prompt; when many arrive together,
none finds it in the cache yet. Computing it once per turn multiplies the prefill work; instead a fresh turn (nothing
computed but what the cache gave) follows the older prefilling turn it shares the most with (one that does not wait
itself: followers of one leader all go on after one step), and sits out while that one prefills. Prefills are served
oldest first, so what a follower gives up is only the budget its leader leaves over in those steps; what it saves is
every shared token. A turn follows at most once: when its leader has stored its prompt (or ended in any way) it looks
again (:meth:`chat.engine.turn.Turn.look_again`) and goes on from the longest prefix it finds. Only runtimes without
recurrent layers (any prefix of a stored prompt can be restored) and only within a namespace (same weights, dtype and
tenant), as the cache itself shares.

**Grammar masks off the critical path.** A constrained turn's next mask depends only on the tokens it has, so the masks
of every constrained turn of a step are computed (in llguidance's threads, without the GIL) while the forward runs
(:class:`chat.engine.constraints.MaskBatch`); sampling then only applies them.

**Fairness.** Decoding turns rotate through the seats; prefills are served first come, first served, and new turns
join at the next step. Nothing waits on a turn that arrived later.

**Failure isolation.** The runtime reports an error per feed: a feed that fails alone ends only its own turn
(finish_reason "error", nothing stored); when a batched forward fails, the runtime rolls every run back and runs each
feed alone, so the others produce the same tokens they would have produced without the failing turn. If the runtime
itself raises (a bug), every turn of that step fails and the engine goes on with the next step.

Not thread-safe: the engine's worker thread owns it (a turn's ``cancel`` may come from any thread).
"""

from __future__ import annotations

from collections import deque
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
        self._decoding: deque[Turn] = deque()  # rotation order of decoding turns
        self._prefilling: list[Turn] = []  # prefilling turns, oldest first
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
        """Take a begun turn; it joins the next step."""
        (self._decoding if turn.decoding else self._prefilling).append(turn)

    def step(self) -> list[tuple[Turn, list[Event]]]:
        """Run one step (see the module docstring); return each affected turn's events."""
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
            elif turn.decoding and not was_decoding:  # the prompt is absorbed: join the decoding rotation
                self._prefilling.remove(turn)
                self._leaders.pop(turn, None)
                self._decoding.append(turn)
        return results

    def stop_all(self) -> list[tuple[Turn, list[Event]]]:
        """End every active turn now ("cancelled"), storing what was computed."""
        out = [(turn, turn.stop("cancelled")) for turn in self.turns()]
        self._decoding.clear()
        self._prefilling.clear()
        self._leaders.clear()
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
        for turn in self._prefilling:
            if len(plan) >= s.max_batch:
                break
            if self._waits(turn):
                continue
            give = max(budget, MIN_PREFILL_CHUNK) if turn is self._prefilling[0] else budget
            if give <= 0:
                break
            feed = turn.next_feed(give)
            budget -= len(feed.tokens)
            plan.append((turn, feed))
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
        """Up to ``seats`` decoding turns, continuing the rotation where the last step stopped."""
        n = min(seats, len(self._decoding))
        taken = [self._decoding[i] for i in range(n)]
        self._decoding.rotate(-n)  # the next step starts after the last one taken
        return taken

    def _remove(self, turn: Turn) -> None:
        self._leaders.pop(turn, None)
        if turn in self._prefilling:
            self._prefilling.remove(turn)
        elif turn in self._decoding:
            self._decoding.remove(turn)
