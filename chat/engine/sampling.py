"""Sampling settings and the sampler: temperature, top-k, top-p, seed; greedy at temperature 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from chat.engine.errors import InvalidSamplingError

MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 256


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = no limit
    seed: int | None = None  # None = nondeterministic
    max_tokens: int = 256  # reply length cap (also capped by the context window)
    stop: tuple[str, ...] = field(default=())  # strings that end the reply (not included in it)

    def __post_init__(self) -> None:
        _number("temperature", self.temperature, 0.0, 5.0)
        _number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if type(self.top_k) is not int or self.top_k < 0:
            raise InvalidSamplingError("top_k", f"must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and (type(self.seed) is not int or not 0 <= self.seed < 2**63):
            raise InvalidSamplingError("seed", f"must be an integer in [0, 2**63) or null, got {self.seed!r}")
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise InvalidSamplingError("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stop) > MAX_STOP_STRINGS:
            raise InvalidSamplingError("stop", f"at most {MAX_STOP_STRINGS} stop strings")
        for s in stop:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS:
                raise InvalidSamplingError("stop", f"stop strings must be 1..{MAX_STOP_CHARS} characters")
        object.__setattr__(self, "stop", stop)

    def generator(self) -> torch.Generator | None:
        if self.temperature == 0.0:
            return None
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def _number(name: str, value: object, low: float, high: float, *, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidSamplingError(name, f"must be a number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise InvalidSamplingError(name, f"must be in {bound}, got {value!r}")


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick the next token from ``logits`` ``[vocab]``."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    scores = logits.float()
    # Shift so the best score is 0 before dividing: a tiny temperature then sends the others to -inf
    # (a one-hot on the argmax) instead of overflowing every score to inf and softmax to NaN.
    scores = (scores - scores.max()) / params.temperature
    if params.top_k:
        k = min(params.top_k, scores.numel())
        kth = torch.topk(scores, k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        drop = cumulative - sorted_probs >= params.top_p  # keep the smallest set whose mass reaches top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        return int(torch.argmax(logits))  # degenerate scores (all -inf, NaN): fall back to greedy
    return int(torch.multinomial(probs, 1, generator=generator))


class StopMatcher:
    """Streams text while holding back any tail that could still become a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)  # strings that end the reply
        self._held = ""  # text not yet released
        self._hold = max((len(s) - 1 for s in stops), default=0)  # longest tail that may start a stop string

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; return (text safe to emit, whether a stop string was hit)."""
        self._held += text
        hits = [at for at in (self._held.find(stop) for stop in self._stops) if at >= 0]
        if hits:
            out, self._held = self._held[: min(hits)], ""
            return out, True
        if self._hold == 0:
            out, self._held = self._held, ""
            return out, False
        cut = len(self._held) - self._hold
        if cut <= 0:
            return "", False
        out, self._held = self._held[:cut], self._held[cut:]
        return out, False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out
