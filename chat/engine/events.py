"""What goes into the engine (:class:`TurnRequest`) and what comes out of it (:class:`Delta` ... :class:`Done`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chat.engine.sampling import SamplingParams, TokenLogprob

PIN_TTL_S = 300.0  # a breakpoint's default time to live after its last use (Anthropic's "5m"; "1h" is 3600)


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """A prompt-caching breakpoint: the prompt's prefix up to it is pinned in the tenant's cache namespace for
    ``ttl_s`` seconds after its last use (see ``cache.PrefixCache.pin``). Say where it stands by one of:

    - ``offset``: a token offset into the rendered prompt (capped at the prompt's length);
    - ``message``: the end of ``messages[message]`` as the chat template renders it, or, with ``chars``, the end of
      the first ``chars`` characters of its text content (a content block's end, when blocks were joined).
    """

    ttl_s: float = PIN_TTL_S
    offset: int | None = None
    message: int | None = None
    chars: int | None = None

    def __post_init__(self) -> None:
        if (self.offset is None) == (self.message is None):
            raise ValueError("a breakpoint needs exactly one of offset and message")
        for name in ("offset", "message", "chars"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"breakpoint {name} must be a non-negative integer, got {value!r}")
        if self.chars is not None and self.message is None:
            raise ValueError("breakpoint chars needs a message")
        ttl = self.ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86400:
            raise ValueError(f"breakpoint ttl_s must be in (0, 86400] seconds, got {ttl!r}")


@dataclass(frozen=True, slots=True)
class TurnRequest:
    messages: Sequence[dict[str, Any]]  # the conversation; the reply continues it
    params: SamplingParams = field(default_factory=SamplingParams)
    salt: str = ""  # tenant salt: prefixes are shared only within one salt
    prompt_tokens: Sequence[int] | None = None  # already rendered prompt (then `messages` is not rendered)
    tools: Sequence[dict[str, Any]] | None = None  # function definitions for a template that renders them
    template_kwargs: dict[str, Any] | None = None  # variables for the chat template (chat_template_kwargs)
    breakpoints: Sequence[Breakpoint] = ()  # prefixes to pin once the prompt is stored (see Done.pins)


@dataclass(frozen=True, slots=True)
class PinOutcome:
    """What became of one breakpoint (in ``Done.pins``, in the request's order)."""

    breakpoint: Breakpoint
    length: int  # tokens of the prefix it stands for (0 when it could not be placed)
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


Event = Delta | Done
