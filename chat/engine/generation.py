"""One turn as a synchronous state machine: render -> match -> restore -> prefill suffix -> decode -> store.

A :class:`Generation` does its work in small steps (a prefill chunk, or one decoded token) so that a scheduler can
interleave many of them on one model. Each :meth:`Generation.step` returns the events it produced::

    gen = Generation(runtime, cache, request, namespace)
    gen.begin()                      # render, check the window, look up and restore the best prefix
    while not gen.done:
        for event in gen.step():     # Delta ... then exactly one Done
            ...

Entries are stored at the end of the rendered prompt (always a prefix of the next turn, whatever the chat template
does to the finished reply) and at the end of the reply. On models with recurrent layers the prefill is split where
snapshots are wanted: the end of the system prompt and the end of the rendered prompt.

Greedy replies on runtimes that can rewind (no recurrent layers) decode speculatively: a decode step feeds the next
token together with up to ``draft_tokens`` draft tokens found by prompt lookup (:mod:`chat.engine.drafts`; fewer
while drafts keep failing), keeps the drafts that greedy decoding picks itself plus the token after them, and rewinds
the run over the rest. A step then emits one token or several.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cache import Lease, MediaSpan, Namespace, PrefixCache
from chat.engine.drafts import DraftLength, PromptLookup
from chat.engine.errors import ContextOverflowError, InvalidMediaError
from chat.engine.runtime import ModelRuntime, Run
from chat.engine.sampling import SamplingParams, StopMatcher, sample
from modalities.errors import MediaError

PREFILL_CHUNK = 256  # tokens per prefill step: bounds how long other sessions wait for their next token
DRAFT_TOKENS = 4  # most draft tokens verified per decode step (greedy replies on runtimes that can rewind)


@dataclass(frozen=True, slots=True)
class TurnRequest:
    messages: Sequence[dict[str, Any]]  # the conversation; the reply continues it
    params: SamplingParams = field(default_factory=SamplingParams)
    salt: str = ""  # tenant salt: prefixes are shared only within one salt
    prompt_tokens: Sequence[int] | None = None  # already rendered prompt (then `messages` is not rendered)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int  # tokens in the rendered prompt
    cached_tokens: int  # of those, served from the prefix cache
    completion_tokens: int  # tokens generated

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    ttft_ms: float  # request start -> first token
    prefill_ms: float  # time spent in prefill forwards
    decode_tokens_per_s: float  # tokens after the first / time after the first
    total_ms: float  # request start -> done


@dataclass(frozen=True, slots=True)
class Delta:
    text: str  # new text (may be "" while bytes of a character are pending)
    token_ids: tuple[int, ...]  # tokens this delta covers


@dataclass(frozen=True, slots=True)
class Done:
    text: str  # the whole reply
    token_ids: tuple[int, ...]  # every generated token (EOS included if one ended the reply)
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    usage: Usage
    timings: Timings
    error: Exception | None = None  # set when finish_reason == "error"


Event = Delta | Done


class Phase(enum.Enum):
    NEW = "new"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(slots=True)
class _Clock:
    start: float = field(default_factory=time.perf_counter)  # when the request was made
    first_token: float | None = None  # when the first token was sampled
    last_token: float | None = None  # when the latest token was sampled
    prefill_s: float = 0.0  # time in prefill forwards


class Generation:
    """One reply to one request. Not thread-safe: one scheduler thread drives it (``cancel`` may come from any)."""

    def __init__(
        self,
        runtime: ModelRuntime,
        cache: PrefixCache | None,
        request: TurnRequest,
        *,
        record_prefill_logits: bool = False,
        draft_tokens: int = DRAFT_TOKENS,
    ) -> None:
        self.runtime = runtime  # the model
        self.cache = cache  # None: no prefix reuse (`--no-prefix-cache`)
        self.request = request
        self.namespace = Namespace(runtime.fingerprint, runtime.dtype, request.salt)
        self.phase = Phase.NEW
        self.prompt: list[int] = []  # rendered prompt tokens
        self.media: tuple[MediaSpan, ...] = ()  # media items of the prompt (multimodal runtimes)
        self.cached_tokens = 0  # prompt tokens restored from the cache
        self.prefill_logits: torch.Tensor | None = None  # [suffix, vocab] if recorded (tests)
        self._record = record_prefill_logits
        self._lease: Lease | None = None  # held while the run uses cached tensors
        self._run: Run | None = None
        self._fed: list[int] = []  # tokens the run has absorbed, in order
        self._boundaries: list[int] = []  # prefill stops here (ascending; the last is len(prompt))
        self._generated: list[int] = []  # sampled tokens
        self._next: int | None = None  # sampled, not yet fed
        self._text: list[str] = []  # emitted text pieces
        self._detok = runtime.detokenizer()
        self._stops = StopMatcher(request.params.stop)
        self._rng = request.params.generator()
        self._max_tokens = request.params.max_tokens
        self._cancelled = False  # set from any thread; checked before each step
        self._draft_tokens = draft_tokens  # most draft tokens per decode step; 0: no speculation
        self._lookup: PromptLookup | None = None  # prompt + reply so far, when this reply decodes speculatively
        self._draft_len = DraftLength(draft_tokens)  # how many tokens to draft next
        self.drafted = 0  # draft tokens verified
        self.accepted = 0  # of those, the ones greedy decoding picked too
        self._snapshotted: set[int] = (
            set()
        )  # lengths where recurrent state was recorded  # a stop string ended the reply (nothing is held back then)
        self._clock = _Clock()

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def cancel(self) -> None:
        """Ask the generation to stop; it finishes at its next step with finish_reason "cancelled"."""
        self._cancelled = True

    # ---------------------------------------------------------------- steps

    def begin(self) -> None:
        """Render, check the context window, restore the best cached prefix.

        Raises:
            ContextOverflowError: the prompt leaves no room for a reply (nothing was computed or held).
        """
        rt = self.runtime
        req = self.request
        rendered = None
        if req.prompt_tokens is not None:
            self.prompt = list(req.prompt_tokens)
        elif hasattr(rt, "render_prompt"):  # a multimodal runtime: media decoded, placeholders expanded
            try:
                rendered = rt.render_prompt(req.messages)
            except MediaError as exc:
                raise InvalidMediaError(str(exc.item or "messages"), str(exc)) from exc
            self.prompt = list(rendered.tokens)
            self.media = rendered.spans
        else:
            self.prompt = rt.render(req.messages)
        if len(self.prompt) >= rt.context_window:
            raise ContextOverflowError(len(self.prompt), rt.context_window)
        self._max_tokens = min(self._max_tokens, rt.context_window - len(self.prompt))
        match = self.cache.lookup(self.namespace, self.prompt, self.media) if self.cache is not None else None
        if match is not None:
            self._lease = self.cache.acquire(match, self.namespace)
            self.cached_tokens = match.length
            self._fed = self.prompt[: match.length]
        try:
            self._run = rt.new_run(self._lease, rendered) if rendered is not None else rt.new_run(self._lease)
        except BaseException:
            self._release()
            raise
        self._boundaries = self._plan_boundaries()
        self.phase = Phase.PREFILL

    def step(self) -> list[Event]:
        """Do one unit of work; return the events it produced (the last one is a Done when the turn ends)."""
        if self.phase is Phase.DONE:
            return []
        if self.phase is Phase.NEW:
            self.begin()
        try:
            if self._cancelled:
                return self._finish("cancelled")
            if self.phase is Phase.PREFILL:
                return self._prefill_step()
            return self._decode_step()
        except Exception as exc:  # the model failed: give everything back, report, keep the server alive
            return self._finish("error", exc)

    def stop_now(self) -> list[Event]:
        """End the generation at once (e.g. its client vanished), storing what was computed."""
        if self.phase is Phase.DONE:
            return []
        return self._finish("cancelled")

    # ---------------------------------------------------------------- internals

    def _plan_boundaries(self) -> list[int]:
        """Where prefill stops: the end of the system prompt (recurrent models only) and the end of the prompt."""
        end = len(self.prompt)
        marks = {end}
        rt, msgs = self.runtime, self.request.messages
        if rt.has_recurrent_state and self.request.prompt_tokens is None and msgs and msgs[0].get("role") == "system":
            system = rt.render(msgs[:1], add_generation_prompt=False)
            if self.cached_tokens < len(system) < end and self.prompt[: len(system)] == system:
                marks.add(len(system))
        return sorted(m for m in marks if m > self.cached_tokens)

    def _forward(self, tokens: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        assert self._run is not None
        logits = self.runtime.forward(self._run, tokens, last_only=last_only)  # [len(tokens) or 1, vocab]
        self._fed.extend(tokens)
        return logits

    def _prefill_step(self) -> list[Event]:
        target = self._boundaries[0]
        chunk = self.prompt[len(self._fed) : min(target, len(self._fed) + PREFILL_CHUNK)]
        t = time.perf_counter()
        logits = self._forward(chunk, last_only=not self._record)  # only the last row is sampled from
        self._clock.prefill_s += time.perf_counter() - t
        if self._record:
            self.prefill_logits = logits if self.prefill_logits is None else torch.cat([self.prefill_logits, logits])
        if len(self._fed) < target:
            return []
        self._boundaries.pop(0)
        if self.runtime.has_recurrent_state:
            self.runtime.snapshot(self._run)
            self._snapshotted.add(self._run.length)
        if self._boundaries:
            return []
        self._store()  # the end of the rendered prompt: a prefix of the next turn, whatever the template does
        self.phase = Phase.DECODE
        greedy = self.request.params.temperature == 0.0
        if self._draft_tokens > 0 and greedy and getattr(self.runtime, "can_rewind", False):
            self._lookup = PromptLookup(self.prompt)
        return self._accept(sample(logits[-1], self.request.params, self._rng))

    def _decode_step(self) -> list[Event]:
        assert self._next is not None and self._run is not None
        draft = self._draft()
        if draft:
            return self._verify(draft)
        logits = self._forward([self._next])
        return self._accept(sample(logits[-1], self.request.params, self._rng))

    def _draft(self) -> list[int]:
        """Draft tokens to feed after the next one: as many as the reply's budget and the window leave room for."""
        if self._lookup is None:
            return []
        assert self._run is not None
        room = min(
            self._draft_len.now,
            self._max_tokens - len(self._generated) - 1,  # the step also samples one token after the drafts
            self.runtime.context_window - self._run.length - 1,
        )
        return self._lookup.draft(room, self._draft_len.min_ngram)

    def _verify(self, draft: list[int]) -> list[Event]:
        """Feed the next token and ``draft`` in one forward; accept the longest run of drafts that greedy decoding
        picks itself, then the model's pick after them; rewind the run over the rejected drafts."""
        assert self._next is not None and self._run is not None
        base = len(self._fed)
        fed = [self._next, *draft]
        logits = self._forward(fed)  # [1 + len(draft), vocab]
        picks = [sample(row, self.request.params, self._rng) for row in logits]
        kept = 0
        while kept < len(draft) and picks[kept] == draft[kept]:
            kept += 1
        self.runtime.rewind(self._run, len(draft) - kept)
        self.drafted += len(draft)
        self.accepted += kept
        self._draft_len.update(len(draft), kept)
        events: list[Event] = []
        for i in range(kept + 1):
            self._fed[base:] = fed[: 1 + i]  # the tokens before picks[i]: _finish rewinds the run to them
            events.extend(self._accept(picks[i]))
            if self.phase is Phase.DONE:
                break
        return events

    def _accept(self, token: int) -> list[Event]:
        now = time.perf_counter()
        if self._clock.first_token is None:
            self._clock.first_token = now
        self._clock.last_token = now
        self._generated.append(token)
        self._next = token
        if self._lookup is not None:
            self._lookup.extend([token])
        if token in self.runtime.eos_token_ids:
            return self._finish("stop")
        text, stopped = self._stops.push(self._detok.push(token))
        events: list[Event] = []
        if text or not stopped:
            events.append(Delta(text, (token,)))
            self._text.append(text)
        if stopped:
            events.extend(self._finish("stop"))
        elif len(self._generated) >= self._max_tokens:
            events.extend(self._finish("length"))
        return events

    def _store(self) -> None:
        if self.cache is None or self._run is None:
            return
        n = len(self._fed)
        assert n == self._run.length
        if any(span.start < n < span.end for span in self.media):
            return  # stopped inside a media item (a cancelled prefill): no entry may end there
        media = [span for span in self.media if span.end <= n]
        extras = self.runtime.extras(self._run) if hasattr(self.runtime, "extras") else ()
        self.cache.insert(self.namespace, self._fed, self.runtime.export(self._run), media=media, extras=extras)

    def _finish(self, reason: str, error: Exception | None = None) -> list[Event]:
        """Flush held-back text, store what the model absorbed (unless it failed), give everything back."""
        events: list[Event] = []
        if error is None:  # after a stop string nothing is held back: both flushes give ""
            tail, _ = self._stops.push(self._detok.flush())
            tail += self._stops.flush()
            if tail:
                self._text.append(tail)
                events.append(Delta(tail, ()))
        try:
            if self._run is not None and error is None and self._run.length > len(self._fed):
                self.runtime.rewind(self._run, self._run.length - len(self._fed))  # accepted drafts after the end
            if self._run is not None and error is None and len(self._fed) > self.cached_tokens:
                if self.runtime.has_recurrent_state and self._run.length not in self._snapshotted:
                    self.runtime.snapshot(self._run)
                self._store()  # the end of the reply, or as far as a cancelled prefill got
        finally:
            self._release()
        self.phase = Phase.DONE
        c = self._clock
        end = time.perf_counter()
        first = c.first_token if c.first_token is not None else end
        decode_s = (c.last_token or first) - first
        after_first = max(0, len(self._generated) - 1)
        done = Done(
            text="".join(self._text),
            token_ids=tuple(self._generated),
            finish_reason=reason,
            usage=Usage(len(self.prompt), self.cached_tokens, len(self._generated)),
            timings=Timings(
                ttft_ms=(first - c.start) * 1e3,
                prefill_ms=c.prefill_s * 1e3,
                decode_tokens_per_s=after_first / decode_s if decode_s > 0 else 0.0,
                total_ms=(end - c.start) * 1e3,
            ),
            error=error,
        )
        events.append(done)
        return events

    def _release(self) -> None:
        if self._run is not None:
            self.runtime.close_run(self._run)
            self._run = None
        if self._lease is not None and self.cache is not None:
            self.cache.release(self._lease)
            self._lease = None


def run_to_end(gen: Generation) -> tuple[list[Delta], Done]:
    """Drive a generation synchronously (tests, benchmarks, the terminal chat)."""
    deltas: list[Delta] = []
    while True:
        for event in gen.step():
            if isinstance(event, Done):
                return deltas, event
            deltas.append(event)
