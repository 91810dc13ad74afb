"""Sampling settings and the sampler: temperature, top-k, top-p, seed; greedy at temperature 0.

:class:`SamplingParams` is not validated here: the ranges are the wire's (``chat.protocol.sampling.SamplingSettings``,
checked once when a request arrives, on either transport; ``chat.server.turns.sampling_params`` converts). Code that
builds one directly passes values in those ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one reply is sampled (ranges: see the module docstring)."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = no limit
    seed: int | None = None  # None = nondeterministic
    max_tokens: int = 256  # reply length cap (also capped by the context window)
    stop: tuple[str, ...] = field(default=())  # strings that end the reply (not included in it)

    def generator(self) -> torch.Generator | None:
        if self.temperature == 0.0:
            return None
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def greedy(logits: torch.Tensor) -> int:
    """The index of the largest of ``logits`` ``[vocab]`` (the first of equals; a NaN counts as the largest), as
    ``torch.argmax`` gives it: through NumPy for float32 CPU tensors, whose argmax is vectorized (4 us instead of 32
    for a 49,152-token vocabulary, once per decoding turn and step)."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        return int(logits.numpy().argmax())
    return int(torch.argmax(logits))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick the next token from ``logits`` ``[vocab]``."""
    if params.temperature == 0.0:
        return greedy(logits)
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
