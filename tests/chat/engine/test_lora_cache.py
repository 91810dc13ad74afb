"""The prefix cache under LoRA adapters: an adapter's cached prefixes serve only turns under the same weights and
scale (the tagged namespace component ``("lora", identity)``), and a hit is exactly the computation without the
cache (float32 within 1e-4, int8 bit for bit)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cache import Namespace, PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import turn_namespace
from chat.models import load_model
from tests.chat.engine.recording import run_recorded
from tests.chat.models.lora_helpers import logits_of, make_peft_adapter

pytest.importorskip("peft")

TOLERANCE = 1e-4
SYSTEM = {"role": "system", "content": "the cat sat on a mat while two dogs ran far away from home"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-cache")
    return {
        "v1": make_peft_adapter(root / "v1", seed=11, r=4, alpha=8),
        "v2": make_peft_adapter(root / "v2", seed=12, r=4, alpha=8),
    }


@pytest.fixture(scope="module", params=["float32", "int8"])
def runtime(request):
    return load_model("tiny-llama", weights=request.param)


def turn(runtime, cache, messages, adapter=None, salt="", max_tokens=6):
    request = TurnRequest(messages, SamplingParams(max_tokens=max_tokens), salt=salt, adapter=adapter)
    _, done, logits = run_recorded(runtime, cache, request)
    return done, logits


def same(a, b, runtime):
    if runtime.weights == "int8":
        return torch.equal(a, b)
    return (a - b).abs().max().item() <= TOLERANCE


def conversation(done_texts, n):
    messages = [SYSTEM]
    for i in range(n):
        messages.append({"role": "user", "content": f"question {i} about the dogs and the mat"})
        if i < len(done_texts):
            messages.append({"role": "assistant", "content": done_texts[i]})
    return messages


def test_a_hit_under_an_adapter_is_the_computation_without_the_cache(runtime, made):
    adapter = runtime.adapters.read("v1", str(made["v1"][0]))
    cache = PrefixCache()
    replies: list[str] = []
    hits = 0
    for n in range(1, 4):
        messages = conversation(replies, n)
        cached, cached_logits = turn(runtime, cache, messages, adapter)
        fresh, fresh_logits = turn(runtime, None, messages, adapter)
        start = cached.usage.cached_tokens
        hits += start > 0
        assert cached.token_ids == fresh.token_ids
        assert same(cached_logits, fresh_logits[start:], runtime)
        replies.append(cached.text)
    assert hits == 2  # turns 2 and 3 started from turn 1's and 2's entries


def test_the_adapter_turn_is_the_merged_model(made):
    """The engine's prompt logits under an adapter are the peft-merged model's (float32)."""
    rt = load_model("tiny-llama", weights="float32")
    adapter = rt.adapters.read("v1", str(made["v1"][0]))
    messages = conversation([], 1)
    turn_obj, _, logits = run_recorded(rt, None, TurnRequest(messages, SamplingParams(max_tokens=1), adapter=adapter))
    reference = logits_of(made["v1"][1], turn_obj.prompt)
    assert (logits - reference).abs().max().item() <= TOLERANCE


def test_base_prefixes_never_serve_an_adapter_turn_nor_the_reverse(runtime, made):
    adapter = runtime.adapters.read("v1", str(made["v1"][0]))
    cache = PrefixCache()
    messages = conversation([], 1)
    turn(runtime, cache, messages)  # the base model stores its prefix
    under, _ = turn(runtime, cache, messages, adapter)
    assert under.usage.cached_tokens == 0
    again, _ = turn(runtime, cache, messages, adapter)
    assert again.usage.cached_tokens > 0  # the adapter's own entry serves it
    other = [*conversation([], 1), {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    cache2 = PrefixCache()
    turn(runtime, cache2, other[:2], adapter)  # only the adapter stores
    base, _ = turn(runtime, cache2, other[:2])
    assert base.usage.cached_tokens == 0


def test_reloading_a_name_with_other_weights_starts_a_new_namespace(runtime, made):
    bank = runtime.adapters
    old = bank.read("same-name", str(made["v1"][0]))
    bank.add(old, replace=True)
    cache = PrefixCache()
    messages = conversation([], 2)
    turn(runtime, cache, messages, bank.get("same-name"))
    new = bank.read("same-name", str(made["v2"][0]))
    bank.add(new, replace=True)
    assert bank.get("same-name") is new and new.identity != old.identity
    cached, cached_logits = turn(runtime, cache, messages, bank.get("same-name"))
    assert cached.usage.cached_tokens == 0  # no stale hit from the old weights
    _fresh, fresh_logits = turn(runtime, None, messages, new)
    assert same(cached_logits, fresh_logits, runtime)
    _stale, stale_logits = turn(runtime, None, messages, old)
    assert not torch.equal(stale_logits, fresh_logits)
    bank.remove("same-name")


def test_an_adapter_named_like_a_tenant_salt_does_not_collide(runtime, made):
    """An adapter named N (or whose identity is the string S) and a tenant whose salt is N (or S) never share."""
    adapter = runtime.adapters.read("tenant-a", str(made["v1"][0]))
    messages = conversation([], 1)
    for salt in ("tenant-a", adapter.identity, f"lora\0{adapter.identity}"):
        cache = PrefixCache()
        turn(runtime, cache, messages, adapter=adapter, salt="")
        plain, _ = turn(runtime, cache, messages, adapter=None, salt=salt)
        assert plain.usage.cached_tokens == 0, salt
        cache = PrefixCache()
        turn(runtime, cache, messages, adapter=None, salt=salt)
        under, _ = turn(runtime, cache, messages, adapter=adapter, salt="")
        assert under.usage.cached_tokens == 0, salt
    request = TurnRequest(messages, salt="tenant-a")
    assert turn_namespace(runtime, request) != turn_namespace(
        runtime, dataclasses.replace(request, salt="", adapter=adapter)
    )


def test_same_weights_under_two_names_share_prefixes(runtime, made):
    a = runtime.adapters.read("first", str(made["v1"][0]))
    b = runtime.adapters.read("second", str(made["v1"][0]))
    cache = PrefixCache()
    messages = conversation([], 1)
    turn(runtime, cache, messages, a)
    shared, _ = turn(runtime, cache, messages, b)
    assert shared.usage.cached_tokens > 0


def test_tenants_stay_apart_under_one_adapter(runtime, made):
    adapter = runtime.adapters.read("v1", str(made["v1"][0]))
    cache = PrefixCache()
    messages = conversation([], 1)
    turn(runtime, cache, messages, adapter, salt="one")
    other, _ = turn(runtime, cache, messages, adapter, salt="two")
    assert other.usage.cached_tokens == 0
    ns = turn_namespace(runtime, TurnRequest(messages, salt="one", adapter=adapter))
    assert ns == Namespace(runtime.fingerprint, runtime.dtype, "one", (("lora", adapter.identity),))
