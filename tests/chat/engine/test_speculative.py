"""Speculative greedy decoding by prompt lookup: drafts come from the conversation, the reply is the greedy reply,
the run and the cache end up as without drafts, and sampling or recurrent models never speculate."""

from __future__ import annotations

import pytest
import torch

from cache import PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from tests.chat.engine.fakes import FakeRun, FakeRuntime

torch.set_num_threads(1)


# ==================================================================== the pipeline on a fake model


class RewindRuntime(FakeRuntime):
    """The fake model, able to forget tokens (as attention-only models are); counts forwards."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.can_rewind = True
        self.forwards = 0  # forward calls
        self.decode_sizes: list[int] = []  # tokens per forward that returned every row's logits (decode steps)
        self.rewound = 0  # tokens forgotten

    def forward_batch(self, feeds, interrupt=None) -> list:
        self.forwards += 1
        self.decode_sizes += [len(f.tokens) for f in feeds if f.logits == len(f.tokens)]
        return super().forward_batch(feeds, interrupt)

    def rewind(self, run: FakeRun, n: int) -> None:
        self.rewound += n
        super().rewind(run, n)


def repeating(prompt) -> str:
    return "la la la la la la la la la la!"


def chat(rt, cache, turns: int, draft_tokens: int, **params):
    messages = [{"role": "system", "content": "sing"}]
    dones = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"verse {i}"})
        gen = Turn(rt, cache, TurnRequest(list(messages), SamplingParams(**params)), draft_tokens=draft_tokens)
        deltas, done = run_to_end(gen)
        assert "".join(d.text for d in deltas) == done.text
        messages.append({"role": "assistant", "content": done.text})
        dones.append(done)
        if cache is not None:
            cache.check_invariants()
            assert cache.stats().in_use == 0
        assert rt.open_runs == 0
    return dones


@pytest.mark.parametrize("use_cache", [True, False])
def test_drafted_replies_equal_plain_greedy_replies_in_fewer_forwards(use_cache):
    plain_rt, fast_rt = RewindRuntime(script=repeating), RewindRuntime(script=repeating)
    plain = chat(plain_rt, PrefixCache() if use_cache else None, 3, draft_tokens=0)
    fast = chat(fast_rt, PrefixCache() if use_cache else None, 3, draft_tokens=4)
    assert [d.token_ids for d in fast] == [d.token_ids for d in plain]
    assert [d.usage for d in fast] == [d.usage for d in plain]
    assert [d.finish_reason for d in fast] == ["stop"] * 3
    assert plain_rt.rewound == 0 and fast_rt.rewound > 0
    assert fast_rt.forwards < plain_rt.forwards * 0.6


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9, 13])
def test_a_length_limit_inside_a_burst_of_accepted_drafts(max_tokens):
    plain = chat(RewindRuntime(script=repeating), None, 2, draft_tokens=0, max_tokens=max_tokens)
    fast = chat(RewindRuntime(script=repeating), None, 2, draft_tokens=4, max_tokens=max_tokens)
    assert [d.token_ids for d in fast] == [d.token_ids for d in plain]
    assert all(len(d.token_ids) == max_tokens and d.finish_reason == "length" for d in fast)


def test_a_stop_string_inside_a_burst_stores_what_greedy_decoding_would_have():
    plain_cache, fast_cache = PrefixCache(), PrefixCache()
    plain = chat(RewindRuntime(script=repeating), plain_cache, 3, draft_tokens=0, stop=("la la la la la l",))
    fast = chat(RewindRuntime(script=repeating), fast_cache, 3, draft_tokens=4, stop=("la la la la la l",))
    assert [(d.text, d.token_ids, d.usage) for d in fast] == [(d.text, d.token_ids, d.usage) for d in plain]
    assert fast_cache.stats().entries == plain_cache.stats().entries


def test_sampled_replies_and_models_that_cannot_rewind_do_not_speculate():
    rt = RewindRuntime(script=repeating)
    chat(rt, None, 2, draft_tokens=4, temperature=0.7, seed=1)
    assert rt.rewound == 0 and set(rt.decode_sizes) == {1}
    rt.decode_sizes.clear()
    chat(rt, None, 2, draft_tokens=4)  # greedy: drafts
    assert max(rt.decode_sizes) > 1
    no_rewind = FakeRuntime(script=repeating)
    assert not no_rewind.can_rewind
    assert [d.token_ids for d in chat(no_rewind, None, 2, draft_tokens=4)] == [
        d.token_ids for d in chat(RewindRuntime(script=repeating), None, 2, draft_tokens=0)
    ]


# ==================================================================== a real model


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-mistral", "tiny-gemma3"])
def test_tiny_models_give_the_same_greedy_reply_with_drafts(spec):
    from tests.chat.models.helpers import tiny

    model = tiny(spec)
    messages = [{"role": "user", "content": "one two three one two three one two three one two"}]
    replies, gens = {}, {}
    for k in (0, 4):
        gens[k] = Turn(model, None, TurnRequest(messages, SamplingParams(max_tokens=40)), draft_tokens=k)
        _, done = run_to_end(gens[k])
        replies[k] = done.token_ids
    assert replies[4] == replies[0]
    assert gens[0].speculation is None and gens[4].speculation.drafted > 0 and gens[4].speculation.accepted > 0
