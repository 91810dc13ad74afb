"""Multimodal models through the prefix cache: every prefill served from the cache gives the logits of a full forward
of the transformers model (its own media merging and position ids), repeated media are not encoded again, and a
swapped item never hits beyond the text before it."""

from __future__ import annotations

import pytest
import torch

from cache import PrefixCache
from chat.engine.errors import InvalidMediaError
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from chat.models import load_model
from chat.models.hf.families_mm import AUDIO_IN_VIDEO_MARKERS
from tests.chat.engine.recording import run_recorded
from tests.chat.models.mm_helpers import (
    MULTIMODAL,
    audio,
    image,
    mp4,
    mp4_with_audio,
    png,
    reference_logits,
    stock_media,
    user,
    video,
    wav,
)

TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_tokens=3)


@pytest.fixture(
    scope="module",
    params=MULTIMODAL,
)
def model(request):
    torch.set_num_threads(1)
    return load_model(request.param)


def conversation(name: str) -> list[list[dict]]:
    """Turn by turn prompts (each the whole conversation so far); the replies are filled in as the turns run."""
    a, _b = png(1), png(2)  # same size, different pixels
    c = png(3, width=90, height=40)
    first = [{"role": "system", "content": "You are a helpful assistant."}, user("What is in ", image(a), "?")]
    turns: list[list[dict]] = [first]
    turns.append([user("And now this one: ", image(c))])
    turns.append([user(image(a), "Is this the first picture again?")])  # repeats an earlier image
    if name == "tiny-omni":
        turns.append([user("Listen: ", audio(wav()), " and watch ", video(mp4()))])
        turns.append([user("Once more: ", video(mp4()), audio(wav(0.3)))])
    if name == "tiny-qwen3vl":  # videos written frame group by frame group with timestamps
        turns.append([user("Watch ", video(mp4()), " next to ", image(c))])
        turns.append([user("Once more: ", video(mp4()), " and ", video(mp4(frames=5)))])
    return turns


def run_turn(model, cache, messages):
    gen, done, logits = run_recorded(model, cache, TurnRequest(messages, GREEDY))
    assert done.finish_reason in ("stop", "length"), done.error
    gen.prefill_logits = logits
    return gen, done


def test_cached_prefills_match_a_full_forward_and_repeats_are_not_encoded(model):
    cache = PrefixCache()
    history: list[dict] = []
    for number, new in enumerate(conversation(model.name)):
        messages = history + new
        encoded_before = model.media_counters["encoded"]
        gen, done = run_turn(model, cache, messages)
        prompt = model.render_prompt(messages)
        assert list(prompt.tokens) == gen.prompt
        ref = reference_logits(model, prompt)
        diff = (ref[gen.cached_tokens :] - gen.prefill_logits).abs().max().item()
        assert diff < TOL, f"turn {number}: max |diff| {diff}"
        if number > 0:
            assert gen.cached_tokens > 0, f"turn {number} did not hit"
        uncached_new = [it for it in prompt.items if it.span.end > gen.cached_tokens]
        hashes_before = {it.span.content_hash for m in history for it in _items(model, m)}
        fresh = {it.span.content_hash for it in uncached_new} - hashes_before
        assert model.media_counters["encoded"] - encoded_before == len(fresh)  # repeats come from the store
        nocache = run_to_end(Turn(model, None, TurnRequest(messages, GREEDY)))[1]
        assert nocache.token_ids == done.token_ids
        history = [*messages, {"role": "assistant", "content": done.text}]


def _items(model, message):
    if isinstance(message.get("content"), str):
        return []
    return model.render_prompt([message]).items


def test_a_swapped_image_of_the_same_size_hits_only_the_text_before_it(model):
    cache = PrefixCache()
    base = [{"role": "system", "content": "Describe images."}]
    _gen_a, _ = run_turn(model, cache, [*base, user("Look: ", image(png(11)), " what is it?")])
    span_a = model.render_prompt([*base, user("Look: ", image(png(11)), " what is it?")]).items[0].span
    swapped = [*base, user("Look: ", image(png(12)), " what is it?")]
    prompt_b = model.render_prompt(swapped)
    span_b = prompt_b.items[0].span
    assert (span_a.start, span_a.end) == (span_b.start, span_b.end) and span_a.content_hash != span_b.content_hash
    gen_b, _ = run_turn(model, cache, swapped)
    assert gen_b.cached_tokens <= span_b.start
    ref = reference_logits(model, prompt_b)
    assert (ref[gen_b.cached_tokens :] - gen_b.prefill_logits).abs().max().item() < TOL
    # the same tokens with the first image give other logits: the test would see a wrong hit
    ref_a = reference_logits(model, model.render_prompt([*base, user("Look: ", image(png(11)), " what is it?")]))
    assert (ref_a[span_b.end :] - ref[span_b.end :]).abs().max().item() > 1e-3


def test_corrupt_media_fails_the_turn_by_name_and_stores_nothing(model):
    cache = PrefixCache()
    bad = png(5)[:60]
    messages = [user("What is ", image(png(6)), " next to ", image(bad, item="messages[0].content[3]"), "?")]
    gen = Turn(model, cache, TurnRequest(messages, GREEDY))
    entries = len(model.media_store)
    with pytest.raises(InvalidMediaError) as err:
        gen.begin()
    assert err.value.item == "messages[0].content[3]" and "truncated or corrupt" in str(err.value)
    assert cache.stats().entries == 0 and len(model.media_store) == entries  # not even the good image
    cache.check_invariants()


def test_a_kind_the_model_does_not_take_is_refused_by_name():
    llava = load_model("tiny-llava")  # images only
    gen = Turn(llava, PrefixCache(), TurnRequest([user("hear ", audio(wav(), item="messages[0].content[1]"))]))
    with pytest.raises(InvalidMediaError) as err:
        gen.begin()
    assert err.value.item == "messages[0].content[1]" and "audio" in str(err.value)


def test_a_placeholder_typed_in_the_text_is_refused(model):
    token = model._tokenizer.convert_ids_to_tokens(model.family.placeholders["image"])
    gen = Turn(model, PrefixCache(), TurnRequest([user(f"sneaky {token} text", image(png(1)))]))
    with pytest.raises(InvalidMediaError, match="placeholder"):
        gen.begin()


@pytest.mark.parametrize("seed", range(4))
def test_random_conversations_with_edits_and_regenerations_stay_exact(model, seed):
    import random

    rng = random.Random(seed)
    pool = [image(png(40 + i)) for i in range(3)] + [image(png(50, width=90, height=40))]
    if "audio" in model.modalities:
        pool += [audio(wav(0.4)), audio(wav(0.7))]
    if "video" in model.modalities:
        pool.append(video(mp4()))
    cache = PrefixCache()
    messages: list[dict] = [{"role": "system", "content": "Answer."}]
    for step in range(6):
        action = rng.choice(["append", "append", "edit", "regenerate"]) if step else "append"
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if action == "regenerate":  # the same prompt again: drop the reply
            messages = messages[:-1]
        else:
            if action == "edit":  # replace an earlier user message; later ones are dropped
                messages = messages[: rng.choice(users)]
            parts = [f"turn {step}: ", *rng.sample(pool, rng.randint(0, 2)), "what now?"]
            messages = [*messages, user(*parts)]
        gen, done = run_turn(model, cache, messages)
        ref = reference_logits(model, model.render_prompt(messages))
        diff = (ref[gen.cached_tokens :] - gen.prefill_logits).abs().max().item()
        assert diff < TOL, f"step {step} ({action}): max |diff| {diff}"
        if action == "regenerate" and model.has_recurrent_state:  # restorable at snapshots only: media edges too
            edges = [e for span in gen.media for e in (span.start, span.end) if e < len(gen.prompt)]
            assert gen.cached_tokens >= max(edges, default=1)
        elif action == "regenerate":
            assert gen.cached_tokens == len(gen.prompt) - 1
        messages = [*messages, {"role": "assistant", "content": done.text}]
        cache.check_invariants()


def test_videos_with_their_audio_are_one_item_each_and_cached_prefills_stay_exact():
    """Qwen2.5-Omni's use_audio_in_video: a video's frames and its sound interleave in time chunks inside one item
    (one cache span, from <vision_bos> to <vision_eos>); the cache never cuts it, and every prefill served from the
    cache gives the logits of transformers' own forward with use_audio_in_video=True. (transformers takes that flag
    for a whole prompt: every video here has an audio track.)"""
    model = load_model("tiny-omni")
    markers = model.family.markers
    cache = PrefixCache()
    long_clip, short_clip = mp4_with_audio(frames=30, freq=440.0), mp4_with_audio(frames=12, freq=660.0)
    turns = [
        [{"role": "system", "content": "Watch and listen."}, user("What happens in ", video(long_clip), "?")],
        [user("And here, next to ", image(png(3)), ": ", video(short_clip), audio(wav(0.5)))],
        [user(video(long_clip), " Is this the first clip again?")],  # a repeat: found by its digest, not encoded
    ]
    history: list[dict] = []
    for number, new in enumerate(turns):
        messages = history + new
        encoded_before = model.media_counters["encoded"]
        gen, done = run_turn(model, cache, messages)
        prompt = model.render_prompt(messages)
        videos = [it for it in prompt.items if it.span.kind.value == "video"]
        for it in videos:  # one span holding both kinds of runs, framed by the four markers
            span = prompt.tokens[it.span.start : it.span.end]
            assert [span[0], span[1], span[-2], span[-1]] == [markers[name] for name in AUDIO_IN_VIDEO_MARKERS]
            assert {kind for kind, _ in it.prepared.runs} == {"video", "audio"}
            assert span.count(model.family.placeholders["audio"]) == it.prepared.audio_tokens
        assert len(videos) == number + 1  # the conversation's videos so far
        assert not any(it.span.start < gen.cached_tokens < it.span.end for it in prompt.items)
        ref = reference_logits(model, prompt)
        diff = (ref[gen.cached_tokens :] - gen.prefill_logits).abs().max().item()
        assert diff < TOL, f"turn {number}: max |diff| {diff}"
        if number > 0:
            assert gen.cached_tokens > videos[0].span.end  # restored past an interleaved item
        if number == 2:
            assert model.media_counters["encoded"] == encoded_before  # the repeated clip's rows came from the store
        history = [*messages, {"role": "assistant", "content": done.text}]
    # a silent video next to one with sound (transformers cannot take both in one prompt): the cached prefill
    # gives the logits of our own uncached prefill
    mixed = [*history, user("Both: ", video(mp4()), video(short_clip))]
    gen, _ = run_turn(model, cache, mixed)
    _, _, full = run_recorded(model, None, TurnRequest(mixed, GREEDY))
    assert gen.cached_tokens > 0 and (full[gen.cached_tokens :] - gen.prefill_logits).abs().max().item() < TOL
    cache.check_invariants()


def test_a_hybrid_recurrent_vlm_restores_at_turn_and_media_boundaries():
    """Qwen3.5 with its vision tower (gated delta-net layers beside full attention): recurrent state restores only
    where it was snapshotted, so prefill stops at both edges of every image. A new image after cached history hits
    the whole history; a turn that keeps an image but changes the text after it restores at the image's end; both
    give transformers' own logits."""
    model = load_model("tiny-qwen35vl")
    assert model.has_recurrent_state
    cache = PrefixCache()
    first = [{"role": "system", "content": "Answer."}, user("What is ", image(png(61)), " here?")]
    _, done = run_turn(model, cache, first)
    history = [*first, {"role": "assistant", "content": done.text}]
    second = [*history, user("And this: ", image(png(62, width=90, height=40)), " is it the same?")]
    gen, _ = run_turn(model, cache, second)
    prompt = model.render_prompt(second)
    turn_boundary = len(model.render_prompt(history[:2]).tokens)  # the first prompt, then its reply
    assert gen.cached_tokens >= turn_boundary and gen.cached_tokens < prompt.items[-1].span.start
    assert (reference_logits(model, prompt)[gen.cached_tokens :] - gen.prefill_logits).abs().max().item() < TOL
    changed = [*history, user("And this: ", image(png(62, width=90, height=40)), " what colour is it?")]
    gen3, _ = run_turn(model, cache, changed)
    prompt3 = model.render_prompt(changed)
    assert gen3.cached_tokens == prompt3.items[-1].span.end  # the snapshot at the image's end
    assert (reference_logits(model, prompt3)[gen3.cached_tokens :] - gen3.prefill_logits).abs().max().item() < TOL
    cache.check_invariants()


def test_gemma3_images_are_computed_whole_whatever_the_chunk_budget():
    """Gemma 3's image tokens attend to each other both ways: a prefill chunk never cuts an image (it stops before
    one, or takes it whole even over the budget), and every prefill gives transformers' own logits, whose masks make
    the image tokens' blocks bidirectional (without the blocks the logits differ: the check can fail)."""
    from chat.tools.testing.baselines import hf_inputs

    model = load_model("tiny-gemma3mm")
    messages = [
        {"role": "system", "content": "Answer."},
        user("What is ", image(png(71)), " and ", image(png(72, width=90, height=40)), "?"),
    ]
    prompt = model.render_prompt(messages)
    ref = reference_logits(model, prompt)
    causal_inputs = {k: v for k, v in hf_inputs(model, prompt).items() if k != "token_type_ids"}
    with torch.inference_mode():
        causal = stock_media("tiny-gemma3mm")(**causal_inputs).logits[0].float()
    assert (ref - causal).abs().max().item() > 1e-3
    cache = PrefixCache()
    for budget in (1, 3, 6):
        gen, done, logits = run_recorded(model, cache if budget == 6 else None, TurnRequest(messages, GREEDY), budget)
        assert done.finish_reason in ("stop", "length"), done.error
        assert (ref[gen.cached_tokens :] - logits).abs().max().item() < TOL, budget
    history = [*messages, {"role": "assistant", "content": done.text}]
    follow = [*history, user("and ", image(png(73)), " this?")]
    gen, _, logits = run_recorded(model, cache, TurnRequest(follow, GREEDY), 2)
    prompt2 = model.render_prompt(follow)
    assert gen.cached_tokens > prompt.items[-1].span.end  # the history, images included, came from the cache
    assert (reference_logits(model, prompt2)[gen.cached_tokens :] - logits).abs().max().item() < TOL


def test_held_media_reports_each_items_kind_and_sizes_without_touching_the_store():
    from chat.models.hf.multimodal import PREPARED

    torch.set_num_threads(1)
    omni = load_model("tiny-omni")
    messages = [user("Look ", image(png(1)), " and listen ", audio(wav())), user("and ", image(png(3, width=90)))]
    run_turn(omni, PrefixCache(), messages)
    spans = omni.render_prompt(messages).spans
    hidden = omni.full_model.config.get_text_config(decoder=True).hidden_size
    before = (omni.media_store.lru_keys(), omni.media_store.stats())
    held = omni.held_media()
    assert (omni.media_store.lru_keys(), omni.media_store.stats()) == before  # nothing used, nothing counted
    assert [(h.content_hash, h.kind) for h in held] == [(s.content_hash, s.kind.value) for s in spans]
    assert [h.encoded_bytes for h in held] == [(s.end - s.start) * hidden * 4 for s in spans]  # float32 rows
    assert all(h.prepared_bytes > 0 for h in held)
    omni.media_store.discard(spans[0].content_hash, PREPARED)  # the encoder output stays, its inputs do not
    assert [h.prepared_bytes for h in omni.held_media()] == [0] + [h.prepared_bytes for h in held[1:]]
