"""What goes into the engine (:class:`TurnRequest`) and what comes out of it (:class:`Delta` ... :class:`Done`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chat.engine.sampling import SamplingParams, TokenLogprob


@dataclass(frozen=True, slots=True)
class CacheBreakpoint:
    """A client's prompt-caching breakpoint (Anthropic's ``cache_control``, ``chat.server.surfaces.anthropic_api``):
    the prompt's first ``tokens`` tokens are to stay in the cache for ``ttl_s`` seconds after their last use.

    Once the turn's prompt is stored, the engine pins that prefix in the tenant's cache namespace
    (``cache.PrefixCache.pin``) and reports the outcome in ``Done.pins``. ``tokens`` counts the rendered prompt (tools
    and template included, volatile lines dropped) up to the end of the marked block, measured by the server as the
    tokens the whole prompt shares with the prompt rendered up to that block."""

    tokens: int  # a prefix of the turn's rendered prompt (<= its length)
    ttl_s: int  # 300 ("5m", the default) or 3600 ("1h")
    where: str = ""  # the marked block on the wire, for errors and metrics ("system.2", "messages.0.content.3")


@dataclass(frozen=True, slots=True)
class TurnRequest:
    messages: Sequence[dict[str, Any]]  # the conversation; the reply continues it
    params: SamplingParams = field(default_factory=SamplingParams)
    salt: str = ""  # tenant salt: prefixes are shared only within one salt
    prompt_tokens: Sequence[int] | None = None  # already rendered prompt (then `messages` is not rendered)
    tools: Sequence[dict[str, Any]] | None = None  # function definitions for a template that renders them
    template_kwargs: dict[str, Any] | None = None  # variables for the chat template (chat_template_kwargs)
    adapter: Any = (
        None  # a LoRA adapter of the runtime (chat.models.decoder.lora.LoraAdapter) the turn computes under, or
    )
    # None for the base model; its `namespace_component` ("lora", digest) is added to the turn's cache namespace
    breakpoints: tuple[CacheBreakpoint, ...] = ()  # prompt-caching breakpoints, ascending (see CacheBreakpoint):
    # their prefixes are pinned once the prompt is stored (see Done.pins)
    report_prefill: bool = False  # also send a PrefillPlanned event before the first token (Anthropic's
    # message_start carries the prompt's usage)


@dataclass(frozen=True, slots=True)
class PinOutcome:
    """What became of one breakpoint (in ``Done.pins``, in the request's order)."""

    breakpoint: CacheBreakpoint
    length: int  # tokens of the prefix it stands for (its tokens, capped at the prompt's length)
    pinned: bool  # held now (pinned, or an existing pin of the same prefix renewed)
    reason: str | None = None  # why not (see chat.engine.turn.PIN_REFUSALS); None when pinned


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int  # tokens in the rendered prompt
    cached_tokens: int  # of those, served from the prefix cache
    completion_tokens: int  # tokens generated
    cache_miss_reason: str | None = None  # why reuse stopped before the prompt's last token (None: it did not);
    # see chat.engine.turn.MISS_REASONS
    cache_miss_at: int | None = None  # the prompt position it names

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    ttft_ms: float  # request start -> first token
    prefill_ms: float  # first prefill forward started -> the prompt absorbed (waits in shared steps included)
    decode_tokens_per_s: float  # tokens after the first / time after the first
    total_ms: float  # request start -> done


@dataclass(frozen=True, slots=True)
class Delta:
    text: str  # new text (may be "" while bytes of a character are pending)
    token_ids: tuple[int, ...]  # tokens this delta covers
    logprobs: tuple[TokenLogprob, ...] = ()  # of those tokens, when the request asked for log-probabilities


@dataclass(frozen=True, slots=True)
class Done:
    text: str  # the whole reply
    token_ids: tuple[int, ...]  # every generated token (EOS included if one ended the reply)
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    usage: Usage
    timings: Timings
    error: Exception | None = None  # set when finish_reason == "error"
    logprobs: tuple[TokenLogprob, ...] = ()  # per reply token (EOS excluded), when asked for
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # per prompt token (None for the first), when asked for
    pins: tuple[PinOutcome, ...] = ()  # one per breakpoint of the request


@dataclass(frozen=True, slots=True)
class PrefillPlanned:
    """Sent once, only to a turn whose request has ``report_prefill``: its prompt was looked up in the cache and its
    prefill began (the first chunk was computed), so ``usage``'s prompt and cached tokens (and the miss reason) are
    what its Done will say; ``completion_tokens`` is 0. It comes before the turn's first Delta (with it, in the same
    engine step, when the prompt is one chunk), so waiting for it never delays the first token."""

    usage: Usage


Event = Delta | Done | PrefillPlanned
