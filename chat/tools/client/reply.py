"""What a finished turn gives back: :class:`Reply`, built from the turn's ``reply.done``."""

from __future__ import annotations

from dataclasses import dataclass

from chat.protocol.content import FinishReason
from chat.protocol.server_events import ReplyDone, Timings, Usage
from chat.protocol.tools import AssistantToolCall


@dataclass(frozen=True, slots=True)
class Reply:
    """One finished turn: the whole reply text, why it ended, token counts and timings."""

    text: str  # the whole reply (partial when cancelled, empty when the turn failed); with calls, the text besides
    finish_reason: FinishReason  # "stop", "length", "tool_calls", "cancelled" or "error"
    turn_id: str  # the server's id of the turn
    message_id: str | None  # the stored assistant message (None in stateless mode or when nothing was stored)
    usage: Usage  # prompt / completion / total tokens, and cached prompt tokens
    timings: Timings  # ttft_ms, decode_tokens_per_s, total_ms, prefill_ms
    tool_calls: tuple[AssistantToolCall, ...] = ()  # the calls the reply made (finish_reason "tool_calls")

    @classmethod
    def of(cls, done: ReplyDone) -> Reply:
        calls = tuple(done.tool_calls or ())
        return cls(done.text, done.finish_reason, done.turn_id, done.message_id, done.usage, done.timings, calls)

    @property
    def prompt_tokens(self) -> int:
        return self.usage.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the server took from its prefix cache."""
        return self.usage.prompt_tokens_details.cached_tokens

    @property
    def completion_tokens(self) -> int:
        return self.usage.completion_tokens

    @property
    def ttft_ms(self) -> float | None:
        """Turn start to first token, in milliseconds; None when no token was generated."""
        return self.timings.ttft_ms

    @property
    def decode_tokens_per_s(self) -> float:
        return self.timings.decode_tokens_per_s
