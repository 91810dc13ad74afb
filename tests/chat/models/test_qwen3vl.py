"""Qwen3-VL (``tiny-qwen3vl``, and its MoE variant ``tiny-qwen3vlmoe``): images and videos through the prefix cache
(Qwen3.5, whose processor is the same, is checked for its prompts and positions too).

A video is written as Qwen3VLProcessor writes it (each temporal patch with its timestamp as text), each frame group is
placed in 3-D as transformers' ``get_rope_index`` places it, and the deepstack features of every item reach the first
decoder layers at exactly its placeholder positions, whatever the chunking or the cached prefix: every prefill gives
the logits of transformers' own forward of the whole conversation."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from cache import PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.models import load_model
from chat.tools.testing.baselines import hf_inputs
from tests.chat.engine.recording import run_recorded
from tests.chat.models.mm_helpers import image, mp4, png, reference_logits, user, video

TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_tokens=3)


@pytest.fixture(scope="module", params=["tiny-qwen3vl", "tiny-qwen3vlmoe"])
def model(request):
    torch.set_num_threads(1)
    return load_model(request.param)


def _processor(model, clip_frames, prepared_video):
    """transformers' Qwen3VLProcessor on the model's tokenizer and image processor. Its video processor needs
    torchvision (not installable here) to decode and resize; the stand-in hands it the frames our preparer made and
    their metadata (frame indices at the clip's 10 fps), and the processor writes the prompt text itself."""
    from transformers import Qwen3VLProcessor
    from transformers.feature_extraction_utils import BatchFeature
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    class GivenFrames(Qwen3VLVideoProcessor):
        def __call__(self, videos, **kwargs):
            metadata = [
                VideoMetadata(total_num_frames=total, fps=10.0, frames_indices=indices)
                for total, indices in clip_frames
            ]
            pixels = torch.cat([p.inputs["pixel_values_videos"] for p in prepared_video])
            grids = torch.cat([p.inputs["video_grid_thw"] for p in prepared_video])
            return BatchFeature({"pixel_values_videos": pixels, "video_grid_thw": grids, "video_metadata": metadata})

    class Processor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, name, argument):
            if name == "video_processor":  # the stand-in: transformers' check imports torchvision
                return type(argument)
            return super().check_argument_for_proper_class(name, argument)

    video_settings = model.family.preparers["video"].processor
    stand_in = GivenFrames(patch_size=video_settings.patch_size, merge_size=2, temporal_patch_size=2)
    return Processor(
        image_processor=model.family.preparers["image"].processor, tokenizer=model._tokenizer, video_processor=stand_in
    )


@pytest.fixture(scope="module", params=["tiny-qwen3vl", "tiny-qwen3vlmoe", "tiny-qwen35vl"])
def writer(request):
    """The models whose prompts Qwen3VLProcessor writes (Qwen3.5's processor is Qwen3-VL's)."""
    torch.set_num_threads(1)
    return load_model(request.param)


def test_the_prompt_is_the_processors_token_for_token(writer):
    from modalities import video as video_mod

    model = writer
    clips = [mp4(frames=12), mp4(frames=5)]  # 8 of 12 frames; 5 frames (the last repeated to fill its patch)
    pictures = [png(1), png(3, width=90, height=40)]
    pieces = ["Look: ", image(pictures[0]), " then ", video(clips[0]), " and ", image(pictures[1]), video(clips[1])]
    messages = [{"role": "system", "content": "Be brief."}, user(*pieces, "?")]
    prompt = model.render_prompt(messages)

    options = model.family.preparers["video"].options
    decoded = [video_mod.decode(clip, options=options) for clip in clips]
    clip_frames = [(total, [round(t * 10) for t in d.timestamps]) for total, d in zip((12, 5), decoded, strict=True)]
    videos = [it.prepared for it in prompt.items if it.span.kind.value == "video"]
    processor = _processor(model, clip_frames, videos)
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": p.kind} for p in pieces]
    text = model._tokenizer.apply_chat_template(
        [messages[0], {"role": "user", "content": [*content, {"type": "text", "text": "?"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    images = [Image.open(io.BytesIO(data)).convert("RGB") for data in pictures]
    expected = processor(text=text, images=images, videos=[d.frames for d in decoded], return_tensors="pt")
    assert expected["input_ids"][0].tolist() == list(prompt.tokens)
    pixels = [it.prepared.inputs["pixel_values"] for it in prompt.items if it.span.kind.value == "image"]
    assert torch.equal(expected["pixel_values"], torch.cat(pixels))
    assert torch.equal(expected["mm_token_type_ids"], hf_inputs(model, prompt)["mm_token_type_ids"])
    first = model._tokenizer.decode(prompt.tokens[prompt.items[1].span.start : prompt.items[1].span.end])
    assert first.startswith("<0.1 seconds><|vision_start|>") and first.count("seconds>") == 4  # 8 frames, 4 groups


def test_positions_are_transformers_get_rope_index(writer):
    model = writer
    messages = [user("A ", video(mp4(frames=5)), image(png(2)), " b ", video(mp4(frames=12)), " c")]
    prompt = model.render_prompt(messages)
    run = model.new_run(None, prompt)
    inputs = hf_inputs(model, prompt)
    with torch.inference_mode():
        expected, delta = model.full_model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"], inputs["video_grid_thw"]
        )
    assert torch.equal(run.media.positions, expected[:, 0])
    assert run.media.delta == int(delta)
    model.close_run(run)


def run_turn(model, cache, messages, budget=None):
    args = () if budget is None else (budget,)
    gen, done, logits = run_recorded(model, cache, TurnRequest(messages, GREEDY), *args)
    assert done.finish_reason in ("stop", "length"), done.error
    return gen, done, logits


def test_a_conversation_from_the_cache_is_transformers_forward_and_seen_items_are_not_encoded(model):
    a, b = png(21), png(22)  # the same size, other pixels
    clip = mp4(frames=12)
    turns = [
        [{"role": "system", "content": "Answer."}, user("What is ", image(a), " in ", video(clip), "?")],
        [user("And ", image(png(23, width=90, height=40)), "?")],  # a new image after cached history
        [user(video(clip), " again, with ", image(a))],  # both seen before: taken from the media store
        [user("Swap: ", image(b), " now")],  # same size as a, other pixels: a new item
    ]
    cache, history, seen = PrefixCache(), [], set()
    for number, new in enumerate(turns):
        messages = history + new
        prompt = model.render_prompt(messages)
        encoded_before, skipped_before = model.media_counters["encoded"], model.media_counters["encoder_skipped"]
        gen, done, logits = run_turn(model, cache, messages)
        assert list(prompt.tokens) == gen.prompt
        diff = (reference_logits(model, prompt)[gen.cached_tokens :] - logits).abs().max().item()
        assert diff < TOL, f"turn {number}: max |diff| {diff}"
        assert not any(it.span.start < gen.cached_tokens < it.span.end for it in prompt.items)  # never inside one
        if number:
            assert gen.cached_tokens >= len(model.render_prompt(history[:-1]).tokens)  # the history came from the cache
        computed = [it for it in prompt.items if it.span.end > gen.cached_tokens]
        again = [it for it in computed if it.span.content_hash in seen]
        fresh = {it.span.content_hash for it in computed} - seen
        assert model.media_counters["encoded"] - encoded_before == len(fresh)
        if again:  # encoder_skipped == 1.0: every computed item seen before came from the store
            assert model.media_counters["encoder_skipped"] - skipped_before >= len(again)
        if number == 2:
            assert len(again) == 2 and not fresh
        seen |= {it.span.content_hash for it in prompt.items}
        history = [*messages, {"role": "assistant", "content": done.text}]
    cache.check_invariants()


@pytest.mark.parametrize("budget", [1, 4, 9])
def test_prefill_chunks_that_cut_items_are_exact(model, budget):
    """Chunks of a few tokens cut through images, timestamps and frame groups: each chunk adds the deepstack rows of
    its own placeholders only (with and without a cached prefix)."""
    question = user("Is ", image(png(31)), " in ", video(mp4(frames=5)), "?")
    messages = [{"role": "system", "content": "Answer."}, question]
    prompt = model.render_prompt(messages)
    ref = reference_logits(model, prompt)
    gen, done, logits = run_turn(model, None, messages, budget)
    assert (ref - logits).abs().max().item() < TOL
    cache = PrefixCache()
    run_turn(model, cache, messages, budget)
    follow = [*messages, {"role": "assistant", "content": done.text}, user("and ", video(mp4(frames=12)), "?")]
    gen, _, logits = run_turn(model, cache, follow, budget)
    prompt2 = model.render_prompt(follow)
    assert gen.cached_tokens >= prompt.items[-1].span.end
    assert (reference_logits(model, prompt2)[gen.cached_tokens :] - logits).abs().max().item() < TOL


def test_without_the_deepstack_rows_of_one_chunk_the_logits_differ(model, monkeypatch):
    """The checks above can fail: a forward that leaves out the deepstack rows of the chunk holding the video gives
    other logits than transformers' (and than our own forward that keeps them)."""
    messages = [user("What is ", image(png(41)), " in ", video(mp4(frames=12)), "?")]
    prompt = model.render_prompt(messages)
    ref = reference_logits(model, prompt)
    _, _, kept = run_turn(model, None, messages, 16)
    assert (ref - kept).abs().max().item() < TOL
    video_span = prompt.items[1].span
    original = type(model)._model_inputs

    def dropping(self, run, ids):
        inputs = original(self, run, ids)
        if run.length <= video_span.start < run.length + ids.shape[1]:
            inputs["visual_pos_masks"] = torch.zeros_like(inputs["visual_pos_masks"])
            inputs["deepstack_visual_embeds"] = inputs["deepstack_visual_embeds"][:, :0]
        return inputs

    monkeypatch.setattr(type(model), "_model_inputs", dropping)
    _, _, dropped = run_turn(model, None, messages, 16)
    assert (ref - dropped).abs().max().item() > 1e-3


def test_runs_packed_in_one_forward_give_transformers_logits(model, caplog):
    """Chunks of two runs, both holding media, in one packed forward: each run's tokens get its own deepstack rows
    (the forward's rows are every run's in input order)."""
    import logging

    from chat.engine.runtime import Feed

    caplog.set_level(logging.WARNING, logger="chat.models.adapter")
    first = [user("Is ", image(png(51)), " in ", video(mp4(frames=12)), "?")]
    second = [{"role": "system", "content": "Answer."}, user(video(mp4(frames=5)), " or ", image(png(52)), "!")]
    prompts = [model.render_prompt(m) for m in (first, second)]
    runs = [model.new_run(None, p) for p in prompts]
    rows: list[list[torch.Tensor]] = [[], []]
    budget = 11
    while any(run.length < len(p.tokens) for run, p in zip(runs, prompts, strict=True)):
        feeds = [
            Feed(run, p.tokens[run.length : run.length + budget], min(budget, len(p.tokens) - run.length))
            for run, p in zip(runs, prompts, strict=True)
            if run.length < len(p.tokens)
        ]
        owners = [runs.index(feed.run) for feed in feeds]
        for owner, out in zip(owners, model.forward_batch(feeds), strict=True):
            assert not isinstance(out, Exception), out
            rows[owner].append(out)
    assert not caplog.records  # no packed forward fell back to one forward per run
    for prompt, got, run in zip(prompts, rows, runs, strict=True):
        assert (reference_logits(model, prompt) - torch.cat(got)).abs().max().item() < TOL
        model.close_run(run)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_media_the_family_cannot_take_is_refused_by_name_before_any_compute(model, kind):
    """An aspect ratio over 200 (the processors' smart_resize refuses it): a typed error naming the item; neither the
    cache nor the media store changes."""
    from chat.engine.errors import InvalidMediaError
    from chat.engine.turn import Turn
    from tests.modalities.helpers import av_video

    where = "messages[0].content[3]"
    bad = (
        image(png(9, width=1000, height=4), item=where)
        if kind == "image"
        else video(av_video(width=840, height=4), item=where)
    )
    cache = PrefixCache()
    entries = len(model.media_store)
    turn = Turn(model, cache, TurnRequest([user("What is ", image(png(8)), " next to ", bad, "?")], GREEDY))
    with pytest.raises(InvalidMediaError) as err:
        turn.begin()
    assert err.value.item == where and "aspect ratio" in str(err.value)
    assert cache.stats().entries == 0 and len(model.media_store) == entries


def test_a_one_frame_video_is_one_frame_group_at_its_time(writer):
    """The processor refuses a video of one frame; the preparer sizes it as two and repeats its frame: one temporal
    patch, written at 0.0 seconds."""
    from tests.modalities.helpers import av_video

    prompt = writer.render_prompt([user("Still: ", video(av_video(frames=1)))])
    (item,) = prompt.items
    assert item.prepared.grid_thw[0] == 1 and len(item.prepared.frame_starts) == 1
    text = writer._tokenizer.decode(prompt.tokens[item.span.start : item.span.end])
    assert text.startswith("<0.0 seconds><|vision_start|>") and text.endswith("<|vision_end|>")
    run = writer.new_run(None, prompt)
    assert (reference_logits(writer, prompt) - writer.forward(run, prompt.tokens)).abs().max().item() < TOL
    writer.close_run(run)
