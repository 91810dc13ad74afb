"""A turn computed inside a batch is the turn computed alone: for every tiny family (full attention, sliding window,
each hybrid recurrent) and both tiny multimodal models, in float32 and in int8 (K/V rows in float32 or float16),
concurrent turns of random conversations (hits and misses, edits, regenerations, different lengths, a cancel mid-batch,
one turn whose feed fails inside the forward, turns that wait for the system prompt another computes) give the logits
(max |diff| <= 1e-4) and the greedy tokens of the same turn run alone: replayed on its own, from the cache as the round
found it (or as it was when the turn looked again), with the same chunks.

In float32 they also give what a run without any cache gives (whole prompt, other chunking). Greedy tokens may part
only at a near tie (the two best logits within the tolerance: float rounding of another kernel shape may pick either;
the comparison ends there). int8 on the text families without recurrent layers, with the native kernels
(chat.models.kernels.native), gives exactly what a run without any cache gives: the same tokens and the same logits, bit
for bit. Other int8 cases are held to the first comparison only: int8 quantizes each token's activations, so last-bit
differences of another chunking (torch's attention kernels differ by shape; recurrent scans by chunk) can move an
int8 rounding, and a cached prefix then gives logits close to, not within 1e-4 of, a recomputation.

The batches are made small on purpose (token budget 24, at most 3 turns per forward) so that prompts are prefilled
in chunks next to other turns' decode steps, and decoding turns take seats in rotation.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch

from cache import PrefixCache
from chat.engine.events import Done, TurnRequest
from chat.engine.runtime import Feed
from chat.engine.sampling import SamplingParams
from chat.engine.scheduler import BatchSettings, Scheduler
from chat.engine.turn import Turn
from chat.models.kernels import native
from tests.chat.models.mm_helpers import image, mp4, png, user, video

TOLERANCE = 1e-4
CASES = [
    ("tiny-llama", "float32"),
    ("tiny-mistral", "float32"),
    ("tiny-gemma3", "float32"),
    ("tiny-qwen3next", "float32"),
    ("tiny-lfm2", "float32"),
    ("tiny-falconh1", "float32"),
    ("tiny-granitemoehybrid", "float32"),
    ("tiny-zamba2", "float32"),
    ("tiny-omni", "float32"),
    ("tiny-llava", "float32"),
    ("tiny-smolvlm", "float32"),
    ("tiny-qwen35vl", "float32"),
    ("tiny-mistral3", "float32"),
    ("tiny-gemma3mm", "float32"),
    ("tiny-qwen3vl", "float32"),
    ("tiny-qwen3vlmoe", "float32"),
    ("tiny-llama", "int8"),
    ("tiny-gemma3", "int8"),
    ("tiny-lfm2", "int8"),
    ("tiny-omni", "int8"),
    ("tiny-llama", "float32", "torch"),  # torch's operations instead of the native kernels (chat.models.kernels.native)
    ("tiny-llama", "int8", "torch"),
    ("tiny-gemma3", "int8", "torch", "float16"),  # float16 K/V rows on torch's path (the kernel's are the default)
    ("tiny-llama", "float32", "native", "float16"),
]
WORDS = "the cat sat on a mat while two dogs ran far away from home and never came back again".split()  # noqa: SIM905
# int8 with the native kernels on a text model without recurrent layers: every position is computed the same way in
# any chunk and any batch, so a turn from the cache equals the turn computed without it, bit for bit
EXACT_INT8 = ("tiny-llama", "tiny-gemma3")
POISON_WORD = "zebra"  # only the failing turn's message holds it


class Recorder:
    """The runtime, asking every feed's logits for every token and keeping them per run and position."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.rows: dict[int, dict[int, tuple[int, torch.Tensor]]] = {}  # id(run) -> position -> (token, logits)
        self.widest = 0  # most feeds in one forward_batch call
        self.feeds: dict[int, list[tuple[int, bool]]] = {}  # id(run) -> (tokens, was a decode step) per feed

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def new_run(self, *args, **kwargs):
        run = self.runtime.new_run(*args, **kwargs)
        self.rows[id(run)], self.feeds[id(run)] = {}, []  # not a table of a closed run that had the same id
        return run

    def forward_batch(self, feeds, interrupt=None):
        self.widest = max(self.widest, len(feeds))
        starts = [f.run.length for f in feeds]
        outs = self.runtime.forward_batch([Feed(f.run, f.tokens, len(f.tokens)) for f in feeds], interrupt)
        result = []
        for feed, start, out in zip(feeds, starts, outs, strict=True):
            if isinstance(out, Exception):
                result.append(out)
                continue
            self.feeds.setdefault(id(feed.run), []).append((len(feed.tokens), feed.logits == len(feed.tokens)))
            table = self.rows.setdefault(id(feed.run), {})
            for i, token in enumerate(feed.tokens):
                table[start + i] = (token, out[i])  # a rewound draft's row is overwritten when its position is re-fed
            result.append(out[len(out) - feed.logits :] if feed.logits else None)
        return result


def text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 14)))


def message(rng: random.Random, runtime, poison: bool = False):
    words = text(rng) + (f" {POISON_WORD}" if poison else "")
    if runtime.modalities and rng.random() < 0.5:
        parts = [words, image(png(rng.randint(1, 4), width=rng.choice([40, 56]), height=40))]
        if "video" in runtime.modalities and rng.random() < 0.5:  # frames placed after the image
            parts.append(video(mp4(frames=rng.choice([5, 12]))))
        return user(*parts)
    return {"role": "user", "content": words}


class Held:
    """The cache as a round found it, for replays: each request's match and a lease taken before the round (so the
    entry stays whatever the round stores or supersedes); nothing new is kept."""

    def __init__(self, cache: PrefixCache, namespace, requests, runtime) -> None:
        self.cache = cache
        self.leases: dict[tuple, object] = {}  # prompt tokens -> (match, lease)
        for req in requests:
            prompt = runtime.render_prompt(req.messages)
            match = cache.lookup(namespace, prompt.tokens, prompt.spans)
            if match is not None:
                self.leases[tuple(prompt.tokens)] = (match, cache.acquire(match, namespace))

    def follow(self, tokens: tuple, match, namespace) -> None:
        """A turn of the round restored ``match`` for its prompt ``tokens``: a longer prefix than the round found if
        the round itself stored it (the turn waited for a turn in flight with the same start,
        :mod:`chat.engine.scheduler`). Hold that entry for the turn's replay."""
        held = self.leases.get(tokens)
        if held is not None and held[0].length >= match.length:
            return
        if held is not None:
            self.cache.release(held[1])
        self.leases[tokens] = (match, self.cache.acquire(match, namespace))

    def lookup(self, namespace, tokens, media=()):
        held = self.leases.get(tuple(tokens))
        return held[0] if held else None

    def acquire(self, match, namespace):
        return next(lease for m, lease in self.leases.values() if m is match)

    def release(self, lease) -> None:
        return None  # given back by close()

    def insert(self, *args, **kwargs) -> None:
        return None

    def close(self) -> None:
        for _, lease in self.leases.values():
            self.cache.release(lease)


class Watched:
    """The round's cache, telling :class:`Held` of every prefix a turn of the round restores."""

    def __init__(self, cache: PrefixCache, held: Held) -> None:
        self.cache, self.held = cache, held
        self.asked: dict[int, tuple] = {}  # id(match) -> the prompt it was looked up for

    def __getattr__(self, name):
        return getattr(self.cache, name)

    def lookup(self, namespace, tokens, media=()):
        match = self.cache.lookup(namespace, tokens, media)
        self.asked[id(match)] = tuple(tokens)
        return match

    def acquire(self, match, namespace):
        lease = self.cache.acquire(match, namespace)
        self.held.follow(self.asked[id(match)], match, namespace)
        return lease


def run_batched(recorder: Recorder, cache, requests, *, cancel: int, steps_before_cancel: int):
    """Run ``requests`` concurrently; return (turn, Done, recorded rows, recorded feeds) per request."""
    scheduler = Scheduler(recorder, BatchSettings(max_batch=3, token_budget=24))
    turns = []
    for req in requests:
        turn = Turn(recorder, cache, req)
        turn.begin()
        scheduler.add(turn)
        turns.append(turn)
    logs = [(recorder.rows[id(t._run)], recorder.feeds[id(t._run)]) for t in turns]
    done: dict[int, Done] = {}
    step = 0
    while scheduler.busy:
        if step == steps_before_cancel:
            turns[cancel].cancel()
        for turn, events in scheduler.step():
            if events and isinstance(events[-1], Done):
                done[turns.index(turn)] = events[-1]
        for i, turn in enumerate(turns):  # a turn that waited for another restored a new run (Turn.look_again)
            if turn._run is not None:
                logs[i] = (recorder.rows[id(turn._run)], recorder.feeds[id(turn._run)])
        step += 1
    return [(turns[i], done[i], *logs[i]) for i in range(len(turns))]


def replay(recorder: Recorder, cache, req, feeds: list[tuple[int, bool]]) -> tuple[Turn, Done, dict]:
    """The turn alone, fed in the chunks it was fed in the batch (drafts where it drafted); stopped where it was."""
    turn = Turn(recorder, cache, req)
    turn.begin()
    table = recorder.rows[id(turn._run)]
    events = []
    for size, decoding in feeds:
        if turn.done:  # it parted from the batched turn at a near tie (see same_reply) and ended sooner
            break
        feed = turn.next_feed(size, drafts=decoding and size > 1)
        (out,) = recorder.forward_batch([feed])
        events = turn.fail(out) if isinstance(out, Exception) else turn.absorb(out)
    if not turn.done:
        events = turn.stop("cancelled")
    return turn, events[-1], table


def run_fresh(recorder: Recorder, req) -> tuple[Turn, Done, dict]:
    """The turn alone without any cache, chunked as a lone turn is."""
    turn = Turn(recorder, None, req)
    turn.begin()
    table = recorder.rows[id(turn._run)]
    while True:
        events = turn.step()
        if events and isinstance(events[-1], Done):
            return turn, events[-1], table


def near_tie(row: torch.Tensor) -> bool:
    """The two best logits are within the tolerance of each other: float rounding may pick either."""
    top = row.topk(2).values
    return (top[0] - top[1]).item() <= 2 * TOLERANCE


def same_reply(done: Done, prompt_length: int, reference: tuple[Turn, Done, dict]) -> None:
    """The replies are the same, or part at a token that the reference picked out of a near tie."""
    theirs = reference[1].token_ids
    for k, (a, b) in enumerate(zip(done.token_ids, theirs, strict=False)):
        if a != b:
            assert near_tie(reference[2][prompt_length + k - 1][1]), f"reply token {k} differs without a near tie"
            return
    if done.finish_reason != "cancelled":
        assert len(done.token_ids) == len(theirs)


def compare(turn: Turn, done: Done, table: dict, reference: tuple[Turn, Done, dict]) -> float:
    """Largest logit difference over the positions the batched turn computed, up to where the two replies part at a
    near tie (:func:`same_reply`); the tokens fed must agree up to there."""
    ref_turn, ref_done, ref_table = reference
    sequence = [*ref_turn.prompt, *ref_done.token_ids]
    assert turn.prompt == ref_turn.prompt
    worst = 0.0
    # the last reply token is sampled, never fed: a row at its position or later is a draft rewound at the end
    end = min(max(table, default=-1) + 1, len(turn.prompt) + max(len(done.token_ids) - 1, 0))
    for position in range(turn.cached_tokens, end):
        token, row = table[position]
        if position >= len(sequence) or position not in ref_table or token != sequence[position]:
            assert position > len(turn.prompt) and near_tie(ref_table[position - 1][1]), f"position {position}"
            break
        worst = max(worst, (row - ref_table[position][1]).abs().max().item())
    return worst


SENTINEL = 1234.5


def poison_the_last_layer(model, token: int) -> list:
    """Make a forward fail in its last decoder layer (after every other layer stored its K/V) whenever ``token`` is
    among its inputs: token ids, or embeddings (multimodal stacks), where the token's rows are made constant.
    Returns the hooks to remove."""
    layers = next(m for name, m in model._model.named_modules() if name.endswith("layers"))
    seen = {"poison": False}

    def mark(module, args, output):
        output[args[0] == token] = SENTINEL  # (a tied LM head keeps its weights: nothing else changes)
        return output

    def inputs(module, args, kwargs):
        ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
        if ids is not None:
            seen["poison"] = bool((ids == token).any())
        else:
            seen["poison"] = bool((embeds == SENTINEL).all(dim=-1).any())

    def last(module, args, kwargs):
        if seen["poison"]:
            seen["poison"] = False
            raise RuntimeError("poisoned input")

    return [
        model._model.get_input_embeddings().register_forward_hook(mark),
        model._model.register_forward_pre_hook(inputs, with_kwargs=True),
        layers[-1].register_forward_pre_hook(last, with_kwargs=True),
    ]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def model(request):
    from chat.models import load_model
    from chat.models.kernels import native

    name, weights, *rest = request.param
    kernels, kv_dtype = rest[0] if rest else "native", rest[1] if len(rest) > 1 else None
    if kernels == "torch":
        with native.disabled():
            yield load_model(name, weights=weights, kv_dtype=kv_dtype)
    else:
        yield load_model(name, weights=weights, kv_dtype=kv_dtype)


def test_turns_in_a_batch_give_what_they_give_alone(model, caplog):
    caplog.set_level(logging.WARNING, logger="chat.models.adapter")
    weights = model.weights
    exact = weights == "int8" and model.name in EXACT_INT8 and native.kernels() is not None
    exact_checked = 0
    rng = random.Random(7)
    recorder = Recorder(model)
    cache = PrefixCache()
    poison = model.encode(POISON_WORD)[0]  # "z": no other message holds it
    hooks = poison_the_last_layer(model, poison)
    try:
        system = {"role": "system", "content": " ".join(WORDS)}  # one application: its turns start alike
        conversations: list[list] = [[system] for _ in range(3)]
        worst, hits, followed = 0.0, 0, 0
        for round_ in range(3):
            requests = []
            for c, history in enumerate(conversations):
                action = rng.choice(["append", "append", "edit", "regenerate"]) if round_ else "append"
                users = [i for i, m in enumerate(history) if m["role"] == "user"]
                if action == "regenerate" and history[-1]["role"] == "assistant":
                    history = history[:-1]
                elif action == "edit" and users:
                    history = [*history[: rng.choice(users)], message(rng, model)]
                else:
                    history = [*history, message(rng, model)]
                conversations[c] = history
                requests.append(TurnRequest(list(history), SamplingParams(max_tokens=rng.randint(3, 9))))
            poisoned = len(requests)  # a fresh conversation whose message makes its forward fail
            requests.append(TurnRequest([message(rng, model, poison=True)], SamplingParams(max_tokens=4)))
            cancel = rng.randrange(len(conversations))
            namespace = Turn(model, cache, requests[0]).namespace
            held = Held(cache, namespace, requests[:poisoned], model)  # the cache as this round finds it
            watched = Watched(cache, held)
            results = run_batched(recorder, watched, requests, cancel=cancel, steps_before_cancel=rng.randint(2, 8))
            assert results[poisoned][1].finish_reason == "error"
            assert "poisoned input" in str(results[poisoned][1].error)
            for i, (turn, done, table, feeds) in enumerate(results[:poisoned]):
                if round_ == 0:  # the cache was empty: a hit is a prefix that a turn in flight stored
                    followed += turn.cached_tokens > 0
                alone = replay(recorder, held, requests[i], feeds)
                assert alone[0].cached_tokens == turn.cached_tokens
                same_reply(done, len(turn.prompt), alone)
                worst = max(worst, compare(turn, done, table, alone))
                if weights == "float32":
                    fresh = run_fresh(recorder, requests[i])
                    same_reply(done, len(turn.prompt), fresh)
                    worst = max(worst, compare(turn, done, table, fresh))
                elif exact:
                    fresh = run_fresh(recorder, requests[i])
                    assert done.token_ids == fresh[1].token_ids[: len(done.token_ids)]
                    assert compare(turn, done, table, fresh) == 0.0  # bit for bit
                    exact_checked += 1
                hits += turn.cached_tokens > 0
                if done.finish_reason != "cancelled":
                    conversations[i] = [*requests[i].messages, {"role": "assistant", "content": done.text}]
            held.close()
            assert cache.stats().in_use == 0
            cache.check_invariants()
        assert worst <= TOLERANCE, f"max |diff| {worst}"
        assert hits >= 3  # later rounds restore cached prefixes inside the batches
        # in the first round, turns waited for the first one's system prompt (not on recurrent models: see scheduler)
        assert (followed >= 1) != model.has_recurrent_state, followed
        assert recorder.widest == 3  # the batches were full
        assert exact_checked >= 6 or not exact, exact_checked
        failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        assert all("poisoned input" in m for m in failed)  # only forwards with the poisoned feed were re-run alone
    finally:
        for hook in hooks:
            hook.remove()
