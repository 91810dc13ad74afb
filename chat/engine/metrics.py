"""Counters and a time-to-first-token histogram, rendered in Prometheus text format by the server."""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from chat.engine.events import Done

TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Metrics:
    turns: int = 0  # turns finished
    active: int = 0  # turns in progress
    prompt_tokens: int = 0  # over finished turns
    cached_tokens: int = 0  # of those, served from the prefix cache
    completion_tokens: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS_S) + 1))  # last: +Inf
    ttft_sum_s: float = 0.0
    steps: int = 0  # batched forwards run
    step_turns: int = 0  # turns fed, summed over steps (/ steps: mean batch size)
    step_tokens: int = 0  # tokens fed, summed over steps
    steps_interrupted: int = 0  # forwards stopped midway for a better turn (not in steps: they computed nothing)
    turn_pauses: int = 0  # times a turn was paused because its client fell behind reading
    # (chat.server.transport.backpressure)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def turn_started(self) -> None:
        with self._lock:
            self.active += 1

    def turn_paused(self) -> None:
        with self._lock:
            self.turn_pauses += 1

    def turn_done(self, done: Done) -> None:
        with self._lock:
            self.active -= 1
            self.turns += 1
            self.prompt_tokens += done.usage.prompt_tokens
            self.cached_tokens += done.usage.cached_tokens
            self.completion_tokens += done.usage.completion_tokens
            self.finish_reasons[done.finish_reason] = self.finish_reasons.get(done.finish_reason, 0) + 1
            if done.usage.completion_tokens:
                ttft = done.timings.ttft_ms / 1e3
                self.ttft_buckets[bisect_left(TTFT_BUCKETS_S, ttft)] += 1
                self.ttft_sum_s += ttft

    def step_done(self, report: Any) -> None:
        """Count one scheduler step (a ``chat.engine.scheduler.StepReport``; None when nothing ran)."""
        if report is None or not report.turns:
            return
        with self._lock:
            if report.interrupted:
                self.steps_interrupted += 1
                return
            self.steps += 1
            self.step_turns += report.turns
            self.step_tokens += report.tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
