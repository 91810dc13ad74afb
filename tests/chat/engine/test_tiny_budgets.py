"""Cache budgets so small that offload and eviction happen on almost every turn change no answer."""

from __future__ import annotations

import random

import pytest

from cache import PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end

WORDS = ["red", "green", "blue", "small", "large", "fast", "slow", "cat", "dog", "bird", "tree", "river", "stone"]


def conversations(runtime, cache, seed: int = 7):
    rng = random.Random(seed)
    replies = []
    histories = [[{"role": "system", "content": f"persona {i}"}] for i in range(4)]
    for _ in range(16):
        history = rng.choice(histories)  # interleaved in random order, so each evicts the others now and then
        history.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(8))})
        _, done = run_to_end(Turn(runtime, cache, TurnRequest(list(history), SamplingParams(max_tokens=6))))
        history.append({"role": "assistant", "content": done.text})
        replies.append(done.token_ids)
        if cache is not None:
            cache.check_invariants()
            assert cache.stats().in_use == 0
    return replies


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-lfm2"])
def test_tiny_budgets_give_the_same_greedy_replies_as_ample_ones(model):
    from chat.models import load_model

    runtime = load_model(model)
    roomy = PrefixCache()
    ample = conversations(runtime, roomy)
    entry = roomy.stats().bytes_per_tier["device"] // roomy.stats().entries  # about one conversation's state
    tiny = PrefixCache(device_budget_bytes=entry * 3 // 2, host_budget_bytes=entry)
    assert conversations(runtime, tiny) == ample
    stats = tiny.stats()
    assert stats.offloads > 0 and stats.evictions > 0  # the budgets really bit
    assert stats.hits > 0 and stats.promotions > 0  # ... and the cache still served, from both tiers
