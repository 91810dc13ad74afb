"""A cache hit never changes an answer: for every cache kind, 30 random multi-turn conversations with edits of
earlier turns and regenerations. Every prefill served from the cache must give the logits of a run without the
cache (max abs diff <= 1e-4, float32), and greedy replies must be token-for-token identical.

Logits of tiny random models are nearly flat, so logits are compared, not only tokens.
"""

from __future__ import annotations

import random

import pytest

from cache import PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from tests.chat.engine.recording import run_recorded

TINY_MODELS = [
    "tiny-llama",
    "tiny-mistral",
    "tiny-gemma3",
    "tiny-qwen3next",
    "tiny-lfm2",
    "tiny-falconh1",
    "tiny-granitemoehybrid",
    "tiny-zamba2",
]
WORDS = "the cat sat on a mat while two dogs ran far away from home and never came back again".split()  # noqa: SIM905
CONVERSATIONS = 30
TOLERANCE = 1e-4


def random_text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))


def run_turn(runtime, cache, messages, max_tokens):
    gen, done, logits = run_recorded(runtime, cache, TurnRequest(messages, SamplingParams(max_tokens=max_tokens)))
    gen.prefill_logits = logits
    return gen, done


@pytest.fixture(scope="module", params=TINY_MODELS)
def runtime(request):
    from chat.models import load_model

    return load_model(request.param)


def test_cached_prefills_match_uncached_runs(runtime):
    rng = random.Random(1234)
    cache = PrefixCache()
    hits = worst = 0.0
    turns = 0
    for _ in range(CONVERSATIONS):
        messages: list[dict] = [{"role": "system", "content": random_text(rng)}]
        for _ in range(rng.randint(2, 4)):
            action = rng.random()
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            if action < 0.2 and users:  # edit an earlier user message: the conversation branches there
                at = rng.choice(users)
                messages = [*messages[:at], {"role": "user", "content": random_text(rng)}]
            elif action < 0.35 and messages[-1]["role"] == "assistant":  # regenerate the last reply
                messages = messages[:-1]
            else:
                if messages[-1]["role"] == "user":
                    messages = messages[:-1]
                messages.append({"role": "user", "content": random_text(rng)})
            max_tokens = rng.randint(1, 12)
            cached_gen, cached = run_turn(runtime, cache, messages, max_tokens)
            fresh_gen, fresh = run_turn(runtime, None, messages, max_tokens)
            assert cached.token_ids == fresh.token_ids, "a cache hit changed the greedy reply"
            start = cached.usage.cached_tokens
            assert fresh.usage.cached_tokens == 0
            diff = (cached_gen.prefill_logits - fresh_gen.prefill_logits[start:]).abs().max().item()
            worst = max(worst, diff)
            assert diff <= TOLERANCE, f"logits differ by {diff} after a hit of {start} tokens"
            hits += start > 0
            turns += 1
            messages.append({"role": "assistant", "content": cached.text})
            cache.check_invariants()
            assert cache.stats().in_use == 0
    assert hits >= turns // 2, f"only {hits} of {turns} turns hit the cache"
    print(f"{runtime.name}: {turns} turns, {hits:.0f} hits, worst logit diff {worst:.2e}")
