"""Sampling settings and the sampler: logit bias, repetition / presence / frequency penalties, a grammar's mask,
temperature, min-p, top-k, top-p, seed; greedy at temperature 0. Log-probabilities of what was picked.

:class:`SamplingParams` is not validated here: the ranges are the wire's (``chat.protocol.sampling.SamplingSettings``,
checked once when a request arrives, on either transport; ``chat.server.reply.turns.sampling_params`` converts). Code
that builds one directly passes values in those ranges.

One row of logits becomes a token in this order (as vLLM does)::

    scores = logits + logit_bias                      # Shaping: bias, then penalties over the reply's own tokens
    scores = penalties(scores)                        #   (repetition: prompt and reply; presence / frequency: reply)
    scores = grammar_mask(scores)                     # the turn's Constraint (chat.engine.constraints), if any
    token  = argmax(scores) if temperature == 0 else sample(softmax(scores / t) cut by min_p, top_k, top_p)

Log-probabilities are the model's own (``log_softmax`` of the raw logits, before any of the above), as vLLM
reports them by default: what the model thinks of each token, whatever the sampler then did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from chat.engine.constraints import GrammarSpec


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one reply is sampled (ranges: see the module docstring)."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = no limit
    min_p: float = 0.0  # drop tokens whose probability is under min_p x the best one's; 0 = off
    seed: int | None = None  # None = nondeterministic
    max_tokens: int | None = 256  # reply length cap (also capped by the context window); None: the window's room
    stop: tuple[str, ...] = field(default=())  # strings that end the reply (not included in it)
    presence_penalty: float = 0.0  # subtracted once from every token already in the reply
    frequency_penalty: float = 0.0  # subtracted per occurrence in the reply
    repetition_penalty: float = 1.0  # divides positive / multiplies negative scores of tokens in prompt or reply
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    logprobs: bool = False  # report each generated token's log-probability
    top_logprobs: int = 0  # ... and the most likely alternatives at each position (0..20)
    prompt_logprobs: bool = False  # report the log-probability of every prompt token after the first (echo)
    grammar: GrammarSpec | None = None  # the reply must match this (chat.engine.constraints)
    thinking_budget: int | None = (
        None  # most thinking tokens (after the start marker) before it is closed for the model
    )
    thinking_start: tuple[int, ...] = ()  # the tokens that open the thinking (a reply that does not open it is free)
    thinking_end: tuple[int, ...] = ()  # the tokens that close it (written for the model when the budget is spent)
    priority: int | None = None  # not sampling but scheduling: lower is served sooner (chat.engine.scheduler); None: 0

    def generator(self) -> torch.Generator | None:
        if self.temperature == 0.0:
            return None
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g

    @property
    def shapes_logits(self) -> bool:
        """Whether scores differ from the raw logits before temperature (bias or penalties)."""
        return bool(self.logit_bias) or self.penalized

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token's log-probability under the model, and the most likely tokens at its position."""

    token: int  # token id
    logprob: float  # log-probability of `token` (natural log)
    top: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first


class Penalties:
    """Repetition, presence and frequency penalties over one reply: what the reply (and, for repetition, the prompt)
    holds so far. Depends on this turn's tokens only, so a turn is penalized the same in any batch."""

    def __init__(self, params: SamplingParams, prompt: Sequence[int]) -> None:
        self.params = params
        self._prompt = list(prompt)  # tokens the repetition penalty also covers
        self._counts: torch.Tensor | None = None  # [vocab] float32: occurrences of each token in the reply
        self._seen: torch.Tensor | None = None  # [vocab] bool: in the prompt or the reply

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` [vocab] penalized, in place."""
        p = self.params
        self._ensure(scores.shape[-1])
        if p.repetition_penalty != 1.0:
            assert self._seen is not None
            picked = scores[self._seen]
            scores[self._seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            assert self._counts is not None
            scores -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0).float()
        return scores

    def record(self, token: int) -> None:
        """A token joined the reply."""
        if self._counts is None:
            return
        if 0 <= token < self._counts.numel():
            self._counts[token] += 1.0
            self._seen[token] = True  # type: ignore[index]

    def _ensure(self, vocab: int) -> None:
        if self._counts is not None:
            return
        self._counts = torch.zeros(vocab, dtype=torch.float32)
        self._seen = torch.zeros(vocab, dtype=torch.bool)
        ids = torch.tensor([t for t in self._prompt if 0 <= t < vocab], dtype=torch.long)
        self._seen[ids] = True


def shape(logits: torch.Tensor, params: SamplingParams, penalties: Penalties | None) -> torch.Tensor:
    """The scores sampling picks from: ``logits`` [vocab] (not changed) with the bias and penalties applied, float32."""
    scores = logits.float().clone() if params.shapes_logits else logits.float()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        scores.index_add_(0, ids, torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32))
    if penalties is not None and params.penalized:
        penalties.apply(scores)
    return scores


def greedy(logits: torch.Tensor) -> int:
    """The index of the largest of ``logits`` ``[vocab]`` (the first of equals; a NaN counts as the largest), as
    ``torch.argmax`` gives it: through NumPy for float32 CPU tensors, whose argmax is vectorized (4 us instead of 32
    for a 49,152-token vocabulary, once per decoding turn and step)."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        return int(logits.numpy().argmax())
    return int(torch.argmax(logits))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick the next token from ``logits`` ``[vocab]`` (already shaped: see :func:`shape`)."""
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
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        drop = cumulative - sorted_probs >= params.top_p  # keep the smallest set whose mass reaches top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        return int(torch.argmax(logits))  # degenerate scores (all -inf, NaN): fall back to greedy
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The log-probability of ``tokens[i]`` under ``logits[i]`` ([n, vocab], raw), with the ``top`` most likely
    tokens of each row (ties: the lower id first, as ``torch.topk`` on CPU gives them)."""
    if not len(tokens):
        return []
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, vocab]
    ids = torch.tensor(list(tokens), dtype=torch.long)
    chosen = logp.gather(1, ids.view(-1, 1)).view(-1).tolist()
    if top <= 0:
        return [TokenLogprob(t, lp) for t, lp in zip(tokens, chosen, strict=True)]
    values, indices = torch.topk(logp, min(top, logp.shape[-1]), dim=-1)
    out = []
    for t, lp, vs, ix in zip(tokens, chosen, values.tolist(), indices.tolist(), strict=True):
        out.append(TokenLogprob(t, lp, tuple(zip(ix, vs, strict=True))))
    return out


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
