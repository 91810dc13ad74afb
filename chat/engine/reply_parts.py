"""A turn's reply-side parts, each with one job: :class:`TurnClock` (when each phase of a turn happened, and its
:class:`~chat.engine.events.Timings`), :class:`ReplyWriter` (sampled tokens -> streamed text, held back while a stop
string may be starting) and :class:`Speculation` (prompt-lookup drafts for a greedy reply, and how well they did).
:class:`chat.engine.turn.Turn` holds one of each."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from chat.engine.drafts import DraftLength, PromptLookup
from chat.engine.events import Delta, Event, Timings, TurnRequest
from chat.engine.runtime import ModelRuntime
from chat.engine.sampling import StopMatcher, TokenLogprob


@dataclass(slots=True)
class TurnClock:
    start: float = field(default_factory=time.perf_counter)  # when the request was made
    prefill_start: float | None = None  # when the first prefill chunk was handed out
    prefill_end: float | None = None  # when the prompt was absorbed
    first_token: float | None = None  # when the first token was sampled
    last_token: float | None = None  # when the latest token was sampled

    def timings(self, tokens: int) -> Timings:
        end = time.perf_counter()
        first = self.first_token if self.first_token is not None else end
        decode_s = (self.last_token or first) - first
        prefill_s = (self.prefill_end or end) - self.prefill_start if self.prefill_start is not None else 0.0
        return Timings(
            ttft_ms=(first - self.start) * 1e3,
            prefill_ms=prefill_s * 1e3,
            decode_tokens_per_s=max(0, tokens - 1) / decode_s if decode_s > 0 else 0.0,
            total_ms=(end - self.start) * 1e3,
        )


class ReplyWriter:
    """The reply as it grows: sampled tokens -> streamed text, held back while a stop string may be starting."""

    def __init__(self, runtime: ModelRuntime, request: TurnRequest, max_tokens: int) -> None:
        self.tokens: list[int] = []  # every sampled token
        self.text: list[str] = []  # text pieces emitted
        self.logprobs: list[TokenLogprob] = []  # of the tokens in emitted deltas, when asked for
        self.max_tokens = max_tokens  # reply length cap (the context window's room included)
        self._eos = runtime.eos_token_ids
        self._detok = runtime.detokenizer()
        self._stops = StopMatcher(request.params.stop)

    def accept(self, token: int, logprob: TokenLogprob | None = None) -> tuple[list[Event], str | None]:
        """Add a sampled token; return its events and the finish reason if the reply ends with it."""
        self.tokens.append(token)
        if token in self._eos:  # not text; its log-probability is reported (lm-eval reads the generated token's)
            if logprob is None:
                return [], "stop"
            self.logprobs.append(logprob)
            return [Delta("", (token,), (logprob,))], "stop"
        text, stopped = self._stops.push(self._detok.push(token))
        events: list[Event] = []
        if text or not stopped:
            events.append(Delta(text, (token,), (logprob,) if logprob is not None else ()))
            self.text.append(text)
            if logprob is not None:
                self.logprobs.append(logprob)
        if stopped:
            return events, "stop"
        return events, "length" if len(self.tokens) >= self.max_tokens else None

    def flush(self) -> list[Event]:
        """Text held back at the end (nothing after a stop string: both flushes then give "")."""
        tail, _ = self._stops.push(self._detok.flush())
        tail += self._stops.flush()
        if not tail:
            return []
        self.text.append(tail)
        return [Delta(tail, ())]


class Speculation:
    """Prompt-lookup drafts for a greedy reply, and how well they did."""

    def __init__(self, prompt: Sequence[int], most: int) -> None:
        self.lookup = PromptLookup(prompt)  # prompt + reply so far
        self.length = DraftLength(most)  # how many tokens to draft next
        self.drafted = 0  # draft tokens verified
        self.accepted = 0  # of those, the ones greedy decoding picked too

    def draft(self, room: int) -> list[int]:
        return self.lookup.draft(min(room, self.length.now), self.length.min_ngram)

    def record(self, drafted: int, kept: int) -> None:
        self.drafted += drafted
        self.accepted += kept
        self.length.update(drafted, kept)
