"""Drive a turn alone while keeping the logits of every prompt token it computed (exactness tests compare them with
a forward of the whole prompt). Asking for more logits than the turn needs changes nothing in the run's state."""

from __future__ import annotations

import torch

from cache import PrefixCache
from chat.engine.events import Done, TurnRequest
from chat.engine.runtime import Feed, ModelRuntime
from chat.engine.turn import PREFILL_CHUNK, Turn


def run_recorded(
    runtime: ModelRuntime, cache: PrefixCache | None, request: TurnRequest, budget: int = PREFILL_CHUNK, **turn_options
) -> tuple[Turn, Done, torch.Tensor]:
    """Run ``request`` to its end, prefill chunks of at most ``budget`` tokens; return the turn, its Done, and the
    logits ``[suffix, vocab]`` of the prompt tokens computed (those after the cached prefix)."""
    turn = Turn(runtime, cache, request, **turn_options)
    turn.begin()
    rows: list[torch.Tensor] = []
    while True:
        prefill = not turn.decoding
        feed = turn.next_feed(budget)
        (out,) = runtime.forward_batch([Feed(feed.run, feed.tokens, len(feed.tokens)) if prefill else feed])
        if isinstance(out, Exception):
            events = turn.fail(out)
        else:
            if prefill:
                rows.append(out)
                out = out[len(out) - feed.logits :] if feed.logits else None
            events = turn.absorb(out)
        if events and isinstance(events[-1], Done):
            return turn, events[-1], torch.cat(rows)
