"""One turn's life: begin (render, look up, restore) -> feeds (prefill chunks, then decoded tokens) -> absorb
(sample, stream) -> finish (store, report).

A :class:`Turn` never runs the model itself: it says what it needs computed next (:meth:`Turn.next_feed`), a
scheduler runs that feed inside a batch with other turns' feeds, and the turn takes the logits back
(:meth:`Turn.absorb`), or the error its feed caused (:meth:`Turn.fail`)::

    turn = Turn(runtime, cache, request)
    turn.begin()                                  # render, check the window, restore the best cached prefix
    while not turn.done:
        feed = turn.next_feed(budget=256)          # a prefill chunk of <= 256 tokens, or the next token (+ drafts)
        [logits] = runtime.forward_batch([feed])
        for event in turn.absorb(logits):          # Delta ... then exactly one Done
            ...

(:meth:`Turn.step` does one such round alone; :func:`run_to_end` drives a turn to its end.) A turn that has computed
nothing yet may look the cache up again (:meth:`Turn.look_again`): the scheduler has it wait while an older turn in
flight computes the prefix they share, then restore it.

**Log-probabilities.** A reply's tokens carry the model's log-probabilities when asked (``logprobs``, and
``top_logprobs`` alternatives): from the raw logits of the step that sampled them, so a turn restored from the cache
reports the same values as one computed without it (the logits are the same: bit for bit with int8 weights).
Prompt log-probabilities (``prompt_logprobs``, what ``/v1/completions`` with ``echo`` asks for) need the logits of
every prompt position, which a restored prefix does not have: **such a turn takes nothing from the cache** (it
computes its whole prompt, and stores it as any turn does, so later turns reuse it).

**Sampling with state.** Penalties count this turn's own tokens; a grammar (:mod:`chat.engine.constraints`) masks the
scores before the pick and ends the turn ("stop") once it cannot take another token. Both depend on the turn alone,
never on what else shares the step. Speculative drafts are for plain greedy replies only (no bias, penalty, grammar
or log-probabilities).

Entries are stored at the end of the rendered prompt (always a prefix of the next turn, whatever the chat template
does to the finished reply) and at the end of the reply. On models with recurrent layers the prefill also stops at
the end of the system prompt and at both edges of each media item, where snapshots are taken.

Greedy replies on runtimes that can rewind decode speculatively when the scheduler leaves room: the next token goes
in with up to ``draft_tokens`` draft tokens found by prompt lookup (:mod:`chat.engine.drafts`); the drafts that
greedy decoding picks itself are kept with the token after them, the rest are rewound. A step then emits one token
or several.
"""

from __future__ import annotations

import enum
import logging
import time

import torch

from cache import CacheError, Lease, LeaseError, MediaSpan, Namespace, PrefixCache
from chat.engine.constraints import CompiledGrammar, Constraint
from chat.engine.errors import ContextOverflowError, InvalidMediaError
from chat.engine.events import Delta, Done, Event, PinOutcome, PrefillPlanned, TurnRequest, Usage
from chat.engine.recent_replies import RecentReplies
from chat.engine.reply_parts import ReplyWriter, Speculation, TurnClock
from chat.engine.runtime import Feed, ModelRuntime, RenderedPrompt, Run
from chat.engine.sampling import Penalties, TokenLogprob, sample, shape, token_logprobs
from chat.engine.volatile_lines import NEARBY_TOKENS, VolatileLines
from modalities.errors import MediaError

PREFILL_CHUNK = 256  # prefill tokens per step when a turn runs alone (the scheduler sets its own budget)
DRAFT_TOKENS = 4  # most draft tokens verified per decode step (greedy replies on runtimes that can rewind)
RESTORE_ATTEMPTS = 3  # lookups tried when the matched entry was dropped before it could be acquired

MISS_REASONS = {  # why a turn's reuse of the cache stopped before its prompt's last token (docs/openai.md). There is
    # deliberately no "another tenant holds this prefix": saying so would tell one tenant what another sent.
    "cold": "nothing cached in this namespace (model, dtype, tenant) starts like this prompt",
    "end_of_cache": "everything cached was reused; the rest of the prompt is new",
    "diverged": "a cached sequence goes on past this point with other tokens: an edited or different message, or a "
    "template that renders the history otherwise than the model wrote it",
    "no_restore_point": "cached further, but no entry can be restored here (inside a media item, between recurrent "
    "snapshots, before a sliding window's start)",
    "evicted": "this namespace held a longer match, evicted since (for room, or its file was lost)",
    "media_changed": "the reuse stopped at a media item that differs from what is cached at that place (another "
    "image, audio or video)",
    "template_drift": "the reuse stopped inside an assistant message that is a recent reply of this tenant: the chat "
    "template renders what the model wrote otherwise (dropped thinking, re-serialized tool calls); the prompt is what "
    "the template renders",
    "volatile_line": "the reuse stopped inside a line that a volatile line pattern matches (per-request noise such as "
    "Claude Code's billing line), kept in the prompt because the server runs with --keep-volatile-lines",
    "prompt_logprobs": "the request asked for prompt log-probabilities: the cache is not used",
    "cache_off": "the server runs without a prefix cache",
}
PIN_REFUSALS = {  # why a breakpoint's prefix was not pinned (Done.pins; docs/anthropic.md)
    "not_cached": "no cache entry restores the prompt at exactly that length (inside a media item, between recurrent "
    "snapshots, or the prompt's entry did not fit the cache)",
    "over_share": "pinning it would take the tenant's pinned bytes past its share of the device tier "
    "(--tenant-cache-share; all of it with shares off), or all pinned bytes past the device budget",
    "not_reached": "the turn ended before its prompt was computed and stored",
    "cache_off": "the server runs without a prefix cache",
}
_log = logging.getLogger(__name__)


class Phase(enum.Enum):
    NEW = "new"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


def turn_namespace(runtime: ModelRuntime, request: TurnRequest) -> Namespace:
    """The cache namespace of a turn: the model's fingerprint and K/V dtype, the tenant's salt, and, under a LoRA
    adapter, its tagged component ``("lora", digest of its weights and scale)`` (never its name)."""
    namespace = Namespace(runtime.fingerprint, runtime.dtype, request.salt)
    if request.adapter is not None:
        namespace = namespace.with_component(*request.adapter.namespace_component)
    return namespace


class Turn:
    """One reply to one request. Not thread-safe: one scheduler thread drives it (``cancel`` may come from any)."""

    def __init__(
        self,
        runtime: ModelRuntime,
        cache: PrefixCache | None,
        request: TurnRequest,
        *,
        draft_tokens: int = DRAFT_TOKENS,
        grammar: CompiledGrammar | None = None,
        replies: RecentReplies | None = None,
        volatile: VolatileLines | None = None,
    ) -> None:
        self.runtime = runtime  # the model
        self.cache = cache  # None: no prefix reuse (`--no-prefix-cache`)
        self.replies = replies  # recent replies of every namespace: this one's is recorded, drift is told by them
        self.request = request
        self.volatile = volatile  # lines dropped from the rendered prompt (or only recognised, to name a miss)
        self.messages = request.messages  # what is rendered: the request's, without volatile lines (set at begin)
        self.namespace = turn_namespace(runtime, request)
        self.phase = Phase.NEW
        self.prompt: list[int] = []  # rendered prompt tokens
        self.media: tuple[MediaSpan, ...] = ()  # media items of the prompt
        self.cached_tokens = 0  # prompt tokens restored from the cache
        params = request.params
        cap = runtime.context_window if params.max_tokens is None else params.max_tokens
        self.reply = ReplyWriter(runtime, request, cap)
        self.constraint = Constraint(grammar) if grammar is not None else None  # the grammar's state, if any
        self.penalties: Penalties | None = None  # set at begin when the request has penalties
        self.prompt_logprobs: list[TokenLogprob | None] = []  # per prompt token, when asked for
        self.speculation: Speculation | None = None  # set when the prompt is absorbed, if this reply drafts
        self.clock = TurnClock()
        self._draft_tokens = draft_tokens  # most draft tokens per decode step; 0: no speculation
        self._lease: Lease | None = None  # held while the run uses cached tensors
        self._run: Run | None = None  # the model state
        self._fed: list[int] = []  # tokens the run has absorbed (its state is exactly these), in order
        self._stops_at: list[int] = []  # prefill stops here (ascending; the last is len(prompt))
        self._snapshots: set[int] = set()  # lengths where recurrent state was recorded
        self._pending: Feed | None = None  # handed out by next_feed, not yet absorbed
        self._rendered: RenderedPrompt | None = None  # what begin rendered (a multimodal run needs it again)
        self._rng = request.params.generator()  # the sampler's random state (None when greedy)
        self._cancelled = False  # set from any thread; acted on at the next step
        self._paused = False  # set from any thread: its client fell behind; a decoding turn sits out steps meanwhile
        self._forced: list[int] = []  # tokens written next instead of sampled (a thinking budget's end marker)
        self._thinking_closed = False  # the reply has closed its thinking (or was made to)
        self._miss: tuple[str | None, int | None] = (None, None)  # why reuse stopped where it did (set at begin)
        self._prefill_reported = not request.report_prefill  # PrefillPlanned sent (or not asked for)
        self._breakpoints: list[int] = []  # each breakpoint's prefix length (set at begin)
        self._pins: tuple[PinOutcome, ...] | None = None  # set once the prompt is stored and its prefixes pinned

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def decoding(self) -> bool:
        return self.phase is Phase.DECODE

    def cancel(self) -> None:
        """Ask the turn to stop; it finishes at its next step with finish_reason "cancelled"."""
        self._cancelled = True

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self, on: bool = True) -> None:
        """Keep the turn out of the steps while it decodes (``on``), or let it back in: its client has not read
        what it was sent (``chat.server.transport.backpressure``). A paused turn keeps its state and its rank; its
        prompt still runs (it sends nothing until its first token); cancelling still ends it. Any thread."""
        self._paused = on

    # ================================================================ begin

    def begin(self) -> None:
        """Render, check the context window, restore the best cached prefix.

        Raises:
            ContextOverflowError: the prompt leaves no room for a reply (nothing was computed or held).
            InvalidMediaError: a media item cannot be used (nothing was computed or held).
        """
        rt, req = self.runtime, self.request
        rendered = None
        if req.prompt_tokens is not None:
            self.prompt = list(req.prompt_tokens)
        else:
            try:
                extra: dict = {"tools": req.tools} if req.tools else {}  # only for runtimes that take them
                if req.template_kwargs:
                    extra["template_kwargs"] = req.template_kwargs
                if getattr(rt, "prompt_encoder", None) is not None:  # a runtime that reuses earlier renders' ids:
                    extra["salt"] = req.salt  # only this tenant's (as the prefix cache's namespace)
                if self.volatile is not None:
                    self.messages = self.volatile.prompt_messages(req.messages)
                rendered = rt.render_prompt(self.messages, **extra)
            except MediaError as exc:
                raise InvalidMediaError(str(exc.item or "messages"), str(exc)) from exc
            self.prompt, self.media = list(rendered.tokens), tuple(rendered.spans)
        self._breakpoints = [min(bp.tokens, len(self.prompt)) for bp in req.breakpoints]
        self._rendered = rendered
        if len(self.prompt) >= rt.context_window:
            raise ContextOverflowError(len(self.prompt), rt.context_window)
        self.reply.max_tokens = min(self.reply.max_tokens, rt.context_window - len(self.prompt))
        if req.params.penalized:
            self.penalties = Penalties(req.params, self.prompt)
        if req.params.prompt_logprobs:
            self.prompt_logprobs = [None]  # the first token has nothing before it
        if self.reuses_cache:
            self._restore()
        self._miss = self._miss_reason()  # before this turn stores anything
        try:
            self._run = rt.new_run(self._lease, rendered, **self._adapter_arg())
        except BaseException:
            self._release()
            raise
        self._stops_at = self._prefill_stops()
        self.phase = Phase.PREFILL

    def _restore(self) -> None:
        """Acquire the best cached prefix. An entry can be dropped between the lookup and the acquire (its disk file
        failed to read back): then look again, and at worst compute the whole prompt."""
        for _ in range(RESTORE_ATTEMPTS):
            match = self.cache.lookup(self.namespace, self.prompt, self.media) if self.cache is not None else None
            if match is None:
                return
            try:
                self._lease = self.cache.acquire(match, self.namespace)
            except LeaseError:
                continue
            self.cached_tokens = match.length
            self._fed = self.prompt[: match.length]
            return

    # ================================================================ breakpoints

    def _pin_breakpoints(self) -> None:
        """Pin each breakpoint's prefix (the prompt was just stored, so its entry restores every one of them)."""
        outcomes = []
        for bp, length in zip(self.request.breakpoints, self._breakpoints, strict=True):
            if self.cache is None:
                outcomes.append(PinOutcome(bp, length, False, "cache_off"))
            elif length < 1:
                outcomes.append(PinOutcome(bp, length, False, "not_cached"))
            else:
                try:
                    result = self.cache.pin(self.namespace, self.prompt, length, bp.ttl_s, media=self.media)
                except CacheError:  # a prefix that ends inside a media item: nothing restores it there
                    outcomes.append(PinOutcome(bp, length, False, "not_cached"))
                    continue
                outcomes.append(PinOutcome(bp, length, result.pinned, result.reason))
        self._pins = tuple(outcomes)

    def _pin_outcomes(self) -> tuple[PinOutcome, ...]:
        if self._pins is not None:
            return self._pins
        reason = "cache_off" if self.cache is None else "not_reached"
        lengths = self._breakpoints or [0] * len(self.request.breakpoints)  # [] when begin did not get so far
        return tuple(PinOutcome(bp, n, False, reason) for bp, n in zip(self.request.breakpoints, lengths, strict=True))

    # ================================================================ a prefix shared with a turn in flight

    @property
    def reuses_cache(self) -> bool:
        """Whether this turn may start from a cached prefix (not when it needs every prompt position's logits)."""
        return self.cache is not None and not self.request.params.prompt_logprobs

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the raw logits with nothing reported but the tokens: the replies that may speculate."""
        p = self.request.params
        plain = not p.shapes_logits and self.constraint is None and not p.logprobs and p.thinking_budget is None
        return p.temperature == 0.0 and plain

    @property
    def fresh(self) -> bool:
        """Begun, and nothing computed yet beyond what the cache gave (a turn that may still look again)."""
        return self.phase is Phase.PREFILL and self._pending is None and len(self._fed) == self.cached_tokens

    def shared_prefix(self, other: Turn) -> int:
        """How many tokens this turn's prompt has in common with ``other``'s from the start, counting only as far as
        an entry that ``other`` stores could serve this turn: the same namespace (weights, dtype, tenant), and the
        same media items (by content hash) up to there. 0 when nothing can be shared."""
        if self.namespace != other.namespace:
            return 0
        a, b = self.prompt, other.prompt
        lo, hi = 0, min(len(a), len(b))  # the length sought lies in [lo, hi]
        if a[:hi] == b[:hi]:
            lo = hi
        while lo < hi:  # binary search with slice comparisons (C speed on long prompts)
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        theirs = set(other.media)
        for span in self.media:  # a media item that differs (or is cut) ends what can be shared before it
            if span.start < lo and (span not in theirs or span.end > lo):
                lo = span.start
        mine = set(self.media)
        for span in other.media:
            if span.start < lo and span not in mine:
                lo = span.start
        return lo

    def look_again(self) -> bool:
        """Restore a longer cached prefix if one was stored since :meth:`begin` (by a turn in flight that shares
        this one's prompt); only while :attr:`fresh`. Returns True if the turn now starts further on. Anything that
        goes wrong leaves the turn as it was (it then computes its prompt itself)."""
        assert self.fresh
        if not self.reuses_cache:
            return False
        match = self.cache.lookup(self.namespace, self.prompt, self.media)
        if match is None or match.length <= self.cached_tokens:
            return False
        try:
            lease = self.cache.acquire(match, self.namespace)
        except LeaseError:
            return False
        try:
            run = self.runtime.new_run(lease, self._rendered, **self._adapter_arg())
        except Exception:
            _log.warning(
                "a turn could not restore the prefix a turn in flight stored; it computes it itself", exc_info=True
            )
            self.cache.release(lease)
            return False
        self._release()  # the run and lease from begin
        self._run, self._lease = run, lease
        self.cached_tokens = match.length
        self._fed = self.prompt[: match.length]
        self._stops_at = self._prefill_stops()
        self._miss = self._miss_reason()
        return True

    def _adapter_arg(self) -> dict:
        """``new_run``'s keyword for the turn's LoRA adapter (none for the base: runtimes without adapters)."""
        return {} if self.request.adapter is None else {"adapter": self.request.adapter}

    def _prefill_stops(self) -> list[int]:
        """Where prefill stops: the end of the prompt; on models with recurrent layers also the end of the system
        prompt and both edges of every media item (a recurrent state is restorable only where it was snapshotted:
        a later turn that keeps an image but changes what follows it, or adds an image after cached history,
        restores right there)."""
        end = len(self.prompt)
        marks = {end}
        rt, msgs = self.runtime, self.messages
        if rt.has_recurrent_state and self.request.prompt_tokens is None and msgs and msgs[0].get("role") == "system":
            system = rt.render(msgs[:1], add_generation_prompt=False)
            if self.cached_tokens < len(system) < end and self.prompt[: len(system)] == system:
                marks.add(len(system))
        if rt.has_recurrent_state:
            marks.update(edge for span in self.media for edge in (span.start, span.end) if 0 < edge < end)
            marks.update(n for n in self._breakpoints if 0 < n < end)  # restorable there, so pinnable
        return sorted(m for m in marks if m > self.cached_tokens)

    # ================================================================ feeds

    def next_feed(self, budget: int, *, drafts: bool = True) -> Feed:
        """What the turn needs computed next: a prefill chunk of at most ``budget`` tokens (ending at the next
        snapshot boundary at the latest), or the next token plus, when ``drafts`` and the budget allow, draft tokens.
        Hand the feed's result to :meth:`absorb` (or its error to :meth:`fail`) before asking again."""
        assert self._run is not None and self._pending is None and budget >= 1
        if self.phase is Phase.PREFILL:
            if self.clock.prefill_start is None:
                self.clock.prefill_start = time.perf_counter()
            start = len(self._fed)
            end = self._chunk_end(start, min(self._stops_at[0], start + budget))
            chunk = self.prompt[start:end]
            wanted = len(chunk) if self.request.params.prompt_logprobs else 1 if end == len(self.prompt) else 0
            feed = Feed(self._run, chunk, wanted)
        else:
            assert self.phase is Phase.DECODE and self.reply.tokens
            draft = self._draft(budget - 1) if drafts else []
            tokens = [self.reply.tokens[-1], *draft]
            feed = Feed(self._run, tokens, len(tokens))
        self._pending = feed
        return feed

    def _chunk_end(self, start: int, end: int) -> int:
        """``end``, moved so that the chunk ``[start, end)`` does not cut a media item on a model whose items are
        computed whole (:attr:`ModelRuntime.whole_media_spans`): back to the item's start, or, when the chunk
        begins there, on to its end (over the budget: an item is one step's work, like a long draft)."""
        if not self.runtime.whole_media_spans:
            return end
        for span in self.media:
            if span.start < end < span.end:
                return span.start if span.start > start else span.end
        return end

    @property
    def pending_ends_prompt(self) -> bool:
        """Whether the prefill chunk handed out by :meth:`next_feed` (not yet absorbed) is the prompt's last: its
        result gives the reply's first token."""
        feed = self._pending
        return (
            feed is not None and self.phase is Phase.PREFILL and len(self._fed) + len(feed.tokens) == len(self.prompt)
        )

    def pending_constraint(self) -> Constraint | None:
        """The grammar whose mask the pending feed's result will need (its last row is sampled), if any: a
        scheduler computes that mask while the forward runs."""
        feed = self._pending
        if self.constraint is None or feed is None or not feed.logits:
            return None
        samples = self.phase is Phase.DECODE or len(self._fed) + len(feed.tokens) == len(self.prompt)
        return self.constraint if samples and self.reply.max_tokens > 0 else None

    def _draft(self, room: int) -> list[int]:
        """Draft tokens after the next one: as many as the budget, the reply's cap and the window leave room for."""
        if self.speculation is None or room <= 0:
            return []
        assert self._run is not None
        room = min(
            room,
            self.reply.max_tokens - len(self.reply.tokens) - 1,  # the step also samples one token after the drafts
            self.runtime.context_window - self._run.length - 1,
        )
        return self.speculation.draft(room)

    def absorb(self, logits: torch.Tensor | None) -> list[Event]:
        """Take the result of the feed from :meth:`next_feed`: ``[feed.logits, vocab]`` logits (None when none
        were asked for). Returns the events it produced (the last is a Done when the turn ends)."""
        feed, self._pending = self._pending, None
        assert feed is not None
        try:
            if self.phase is Phase.PREFILL:
                if not self._prefill_reported:  # its first chunk: what it restored can no longer change
                    self._prefill_reported = True
                    miss, miss_at = self._miss
                    planned = PrefillPlanned(Usage(len(self.prompt), self.cached_tokens, 0, miss, miss_at))
                    return [planned, *self._absorb_prefill(feed, logits)]
                return self._absorb_prefill(feed, logits)
            assert logits is not None
            if len(feed.tokens) > 1:
                return self._verify(feed, logits)
            self._fed.append(feed.tokens[0])
            return self._accept(*self._pick(logits[-1]))
        except Exception as exc:  # a bug or a broken model: this turn fails, nothing is stored
            return self._finish("error", exc)

    def withdraw(self) -> None:
        """The step that was to compute the feed from :meth:`next_feed` was interrupted before computing anything:
        forget the feed (the next :meth:`next_feed` hands out the same work again)."""
        assert self._pending is not None
        self._pending = None

    def fail(self, error: Exception) -> list[Event]:
        """The feed from :meth:`next_feed` failed: end the turn with finish_reason "error" (nothing is stored)."""
        self._pending = None
        return self._finish("error", error)

    def stop(self, reason: str = "cancelled") -> list[Event]:
        """End the turn at once (cancelled, or its client vanished), storing what was computed."""
        if self.phase is Phase.DONE:
            return []
        self._pending = None
        return self._finish(reason)

    def step(self, budget: int = PREFILL_CHUNK) -> list[Event]:
        """One round alone: begin if needed, run the next feed on its own, absorb it."""
        if self.phase is Phase.DONE:
            return []
        if self.phase is Phase.NEW:
            self.begin()
        if self._cancelled:
            return self.stop("cancelled")
        feed = self.next_feed(budget)
        (outcome,) = self.runtime.forward_batch([feed])
        if isinstance(outcome, Exception):
            return self.fail(outcome)
        return self.absorb(outcome)

    # ================================================================ absorbing

    def _absorb_prefill(self, feed: Feed, logits: torch.Tensor | None) -> list[Event]:
        if self.request.params.prompt_logprobs:
            assert logits is not None and len(logits) == len(feed.tokens)
            start = len(self._fed) + 1  # row i predicts prompt[start + i]
            targets = self.prompt[start : start + len(feed.tokens)]
            top = self.request.params.top_logprobs
            self.prompt_logprobs.extend(token_logprobs(logits[: len(targets)], targets, top))
        self._fed.extend(feed.tokens)
        if len(self._fed) < self._stops_at[0]:
            return []
        self._stops_at.pop(0)
        if self.runtime.has_recurrent_state:
            assert self._run is not None
            self.runtime.snapshot(self._run)
            self._snapshots.add(self._run.length)
        if self._stops_at:
            return []
        self.clock.prefill_end = time.perf_counter()
        self._store()  # the end of the rendered prompt: a prefix of the next turn, whatever the template does
        if self.request.breakpoints:
            self._pin_breakpoints()
        self.phase = Phase.DECODE
        if self.reply.max_tokens <= 0:  # max_tokens 0: the prompt only (its log-probabilities, its cache entry)
            return self._finish("length")
        if self._draft_tokens > 0 and self.plain_greedy and self.runtime.can_rewind:
            self.speculation = Speculation(self.prompt, self._draft_tokens)
        assert logits is not None
        return self._accept(*self._pick(logits[-1]))

    def _verify(self, feed: Feed, logits: torch.Tensor) -> list[Event]:
        """The next token and drafts went in together: keep the longest run of drafts that greedy decoding picks
        itself, then the model's pick after them; rewind the run over the rejected drafts."""
        assert self._run is not None and self.speculation is not None
        base = len(self._fed)
        fed, draft = list(feed.tokens), list(feed.tokens[1:])
        picks = [self._sample(row) for row in logits]  # [1 + len(draft)]
        kept = 0
        while kept < len(draft) and picks[kept] == draft[kept]:
            kept += 1
        self.runtime.rewind(self._run, len(draft) - kept)
        self.speculation.record(len(draft), kept)
        events: list[Event] = []
        for i in range(kept + 1):
            self._fed[base:] = fed[: 1 + i]  # the tokens before picks[i]: _finish rewinds the run to them
            events.extend(self._accept(picks[i]))
            if self.phase is Phase.DONE:
                break
        return events

    def _sample(self, row: torch.Tensor) -> int:
        """A plain greedy pick (speculation only)."""
        return sample(row, self.request.params, self._rng)

    def _pick(self, row: torch.Tensor) -> tuple[int, TokenLogprob | None]:
        """The next token from one row of raw logits [vocab]: shaped, masked by the grammar, sampled; with its
        log-probability when asked for."""
        params = self.request.params
        if self._forced:  # the thinking budget is spent: its end marker is written for the model
            return self._forced.pop(0), None
        scores = shape(row, params, self.penalties)
        if self.constraint is not None:
            if scores is row:
                scores = scores.clone()
            self.constraint.mask(scores)
        token = sample(scores, params, self._rng)
        logprob = token_logprobs(row.view(1, -1), [token], params.top_logprobs)[0] if params.logprobs else None
        return token, logprob

    def _accept(self, token: int, logprob: TokenLogprob | None = None) -> list[Event]:
        now = time.perf_counter()
        if self.clock.first_token is None:
            self.clock.first_token = now
        self.clock.last_token = now
        if self.speculation is not None:
            self.speculation.lookup.extend([token])
        if self.penalties is not None:
            self.penalties.record(token)
        if self.constraint is not None:
            self.constraint.accept(token)
        events, reason = self.reply.accept(token, logprob)
        self._check_thinking_budget()
        if reason is None and self.constraint is not None and self.constraint.finished:
            reason = "stop"  # the grammar is complete: nothing may follow
        if reason is not None:
            events.extend(self._finish(reason))
        return events

    def _check_thinking_budget(self) -> None:
        """Once ``thinking_budget`` tokens of thinking are out (after the reply opened it with ``thinking_start``)
        and it is still open, write its end marker next."""
        p = self.request.params
        if p.thinking_budget is None or self._thinking_closed or self._forced or not p.thinking_end:
            return
        start, end, tokens = list(p.thinking_start), list(p.thinking_end), self.reply.tokens
        if len(tokens) < len(start):
            return
        if tokens[: len(start)] != start or tokens[-len(end) :] == end:
            self._thinking_closed = True  # it did not think, or it closed the thinking itself
        elif len(tokens) - len(start) >= p.thinking_budget:
            self._forced = end
            self._thinking_closed = True

    # ================================================================ finishing

    def _store(self) -> None:
        if self.cache is None or self._run is None:
            return
        n = len(self._fed)
        assert n == self._run.length
        if any(span.start < n < span.end for span in self.media):
            return  # stopped inside a media item (a cancelled prefill): no entry may end there
        media = [span for span in self.media if span.end <= n]
        extras = self.runtime.extras(self._run)
        self.cache.insert(self.namespace, self._fed, self.runtime.export(self._run), media=media, extras=extras)

    def _finish(self, reason: str, error: Exception | None = None) -> list[Event]:
        """Flush held-back text, store what the model absorbed (unless it failed), give everything back."""
        events = self.reply.flush() if error is None else []
        try:
            run = self._run
            if run is not None and error is None and run.length > len(self._fed):
                self.runtime.rewind(run, run.length - len(self._fed))  # accepted drafts after the end
            if run is not None and error is None and len(self._fed) > self.cached_tokens:
                if self.runtime.has_recurrent_state and run.length not in self._snapshots:
                    self.runtime.snapshot(run)
                self._store()  # the end of the reply, or as far as a cancelled prefill got
        finally:
            self._release()
        self.phase = Phase.DONE
        miss, miss_at = self._miss
        if self.replies is not None and error is None and reason in ("stop", "length"):
            self.replies.record(self.namespace, self.prompt, self.reply.tokens, "".join(self.reply.text))
        usage = Usage(len(self.prompt), self.cached_tokens, len(self.reply.tokens), miss, miss_at)
        text = "".join(self.reply.text)
        timings = self.clock.timings(len(self.reply.tokens))
        logprobs, prompt_logprobs = tuple(self.reply.logprobs), tuple(self.prompt_logprobs)
        pins = self._pin_outcomes()
        events.append(
            Done(text, tuple(self.reply.tokens), reason, usage, timings, error, logprobs, prompt_logprobs, pins)
        )
        return events

    def _miss_reason(self) -> tuple[str | None, int | None]:
        """Why the reuse of the cache stopped where it did (one of :data:`MISS_REASONS`) and at which position;
        (None, None) when it reached the prompt's last token (which is always computed)."""
        n = len(self.prompt)
        if self.cache is None:
            return "cache_off", 0
        if not self.reuses_cache:
            return "prompt_logprobs", 0
        if self.cached_tokens >= n - 1:
            return None, None
        try:
            common, goes_on = self.cache.reach(self.namespace, self.prompt, self.media)
            evicted = self.cache.evicted_reach(self.namespace, self.prompt, self.media)
            drift = goes_on and self.replies is not None
            drift = drift and self.replies.drift_at(self.namespace, self.prompt, common, self.messages)
        except Exception:  # a report only: never fail a turn for it
            return None, None
        if common > self.cached_tokens:
            return "no_restore_point", self.cached_tokens
        if evicted > common:
            return "evicted", common
        if goes_on and any(span.start == common for span in self.media):
            return "media_changed", common
        if drift:
            return "template_drift", common
        if goes_on and self._in_volatile_line(common):
            return "volatile_line", common
        if goes_on:
            return "diverged", common
        return ("cold", 0) if common == 0 else ("end_of_cache", common)

    def _in_volatile_line(self, position: int) -> bool:
        """Whether prompt position ``position`` lies in a line a volatile pattern matches (only with lines kept:
        dropped ones are not in the prompt). Reads the text around it back from the tokens."""
        volatile, decode = self.volatile, getattr(self.runtime, "decode", None)
        if volatile is None or volatile.drop or decode is None or not volatile.present(self.messages):
            return False
        try:
            before = decode(self.prompt[:position])
            after = decode(self.prompt[position : position + NEARBY_TOKENS])
        except Exception:  # a report only
            return False
        return volatile.line_at(before, after)

    def _release(self) -> None:
        if self._run is not None:
            self.runtime.close_run(self._run)
            self._run = None
        if self._lease is not None and self.cache is not None:
            self.cache.release(self._lease)
            self._lease = None


def run_to_end(turn: Turn, budget: int = PREFILL_CHUNK) -> tuple[list[Delta], Done]:
    """Drive a turn alone to its end (tests, benchmarks, the terminal chat)."""
    deltas: list[Delta] = []
    while True:
        for event in turn.step(budget):
            if isinstance(event, Done):
                return deltas, event
            deltas.append(event)
