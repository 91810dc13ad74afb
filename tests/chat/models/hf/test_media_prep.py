"""Media bytes -> encoder inputs: the layouts transformers' processors use, token counts, and typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chat.models.hf.media_prep import QwenImagePreparer, QwenVideoPreparer, WhisperAudioPreparer, whisper_output_tokens
from modalities.errors import CorruptMediaError, MediaTooLargeError, UnsupportedFormatError
from modalities.video import VideoOptions
from tests.chat.models.mm_helpers import mp4, mp4_with_audio, png, wav
from tests.modalities.helpers import sf_audio


def qwen_processor(max_pixels: int):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=max_pixels)


def test_video_rows_follow_the_qwen2_vl_video_layout():
    """Reference: transformers' Qwen2-VL video processor flattens [T, C, H, W] frames as
    (t, tp, C, h/m, m, P, w/m, m, P) -> (t, h/m, w/m, m, m, C, tp, P, P)."""
    torch.set_num_threads(1)
    processor = qwen_processor(56 * 56)
    preparer = QwenVideoPreparer(processor, options=VideoOptions(num_frames=5))  # odd: the last frame is repeated
    out = preparer.prepare(mp4(), None, "vid")
    t, h, w = out.grid_thw
    from modalities import video as video_mod

    frames = list(video_mod.decode(mp4(), options=VideoOptions(num_frames=5)).frames)
    frames.append(frames[-1])
    assert t == len(frames) // 2
    stack = []
    for frame in frames:  # the processor's own resize / rescale / normalise, one frame at a time
        single = processor(images=[frame], return_tensors="pt")["pixel_values"]
        stack.append(single.reshape(h // 2, w // 2, 2, 2, 3, 2, 14, 14)[:, :, :, :, :, 0])
    # undo the image patch layout back to [C, H, W] per frame
    pixels = torch.stack([s.permute(4, 0, 2, 5, 1, 3, 6).reshape(3, h * 14, w * 14) for s in stack])  # [T, C, H, W]
    m, p, tp = 2, 14, 2
    ref = (
        pixels.reshape(t, tp, 3, h // m, m, p, w // m, m, p)
        .permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        .reshape(t * h * w, 3 * tp * p * p)
    )
    assert torch.equal(out.inputs["pixel_values_videos"], ref)
    assert out.tokens == t * h * w // 4 and out.inputs["video_grid_thw"].tolist() == [[t, h, w]]
    assert out.second_per_grid == pytest.approx(2 / (5 / 1.2))  # 5 frames over the 1.2 s clip


def test_image_tokens_are_the_merged_patch_count():
    out = QwenImagePreparer(qwen_processor(112 * 112)).prepare(png(1, 100, 80), None, "img")
    t, h, w = out.grid_thw
    assert out.tokens == t * h * w // 4 and out.inputs["pixel_values"].shape[0] == t * h * w


def test_audio_tokens_match_the_omni_processor_formula():
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

    preparer = WhisperAudioPreparer(WhisperFeatureExtractor(feature_size=16))
    for seconds in (0.3, 1.0, 2.5):
        out = preparer.prepare(wav(seconds), None, "aud")
        frames = out.inputs["input_features"].shape[1]
        assert frames == round(seconds * 100)
        assert (
            out.tokens == whisper_output_tokens(frames) == int(_get_feat_extract_output_lengths(torch.tensor(frames)))
        )
    assert np.isfinite(out.inputs["input_features"].numpy()).all()


def test_audio_longer_than_the_extractor_window_is_refused_not_cut():
    from transformers import WhisperFeatureExtractor

    preparer = WhisperAudioPreparer(WhisperFeatureExtractor(feature_size=16))
    with pytest.raises(MediaTooLargeError) as err:
        preparer.prepare(sf_audio("WAV", "PCM_16", seconds=31.0), None, "messages[2].content[0]")
    assert err.value.item == "messages[2].content[0]" and err.value.limit == "max_seconds"


@pytest.mark.parametrize(
    "data, declared, error",
    [
        (b"", None, CorruptMediaError),
        (png(1)[:50], None, CorruptMediaError),
        (png(1), "image/jpeg", UnsupportedFormatError),
        (b"GIF89a" + b"\x00" * 40, None, UnsupportedFormatError),
    ],
)
def test_bad_images_get_typed_errors_naming_the_item(data, declared, error):
    with pytest.raises(error) as err:
        QwenImagePreparer(qwen_processor(112 * 112)).prepare(data, declared, "messages[0].content[2]")
    assert err.value.item == "messages[0].content[2]"


def test_fingerprints_differ_when_a_setting_that_changes_the_input_differs():
    small, large = QwenImagePreparer(qwen_processor(56 * 56)), QwenImagePreparer(qwen_processor(112 * 112))
    assert small.fingerprint != large.fingerprint
    assert small.fingerprint == QwenImagePreparer(qwen_processor(56 * 56)).fingerprint


def omni_video_preparers():
    from transformers import WhisperFeatureExtractor

    from chat.models.hf.mrope import MropeSpec

    spec = MropeSpec("qwen2_5_omni", 2, time_scale=25.0, seconds_per_chunk=2.0)
    audio = WhisperAudioPreparer(WhisperFeatureExtractor(feature_size=16))
    with_audio = QwenVideoPreparer(qwen_processor(56 * 56), audio=audio, mrope=spec)
    return with_audio, QwenVideoPreparer(qwen_processor(56 * 56))


def test_a_video_with_its_audio_track_is_one_item_of_interleaved_runs():
    with_audio, frames_only = omni_video_preparers()
    data = mp4_with_audio(frames=30)  # 3 s: two 2-second chunks of video and of audio
    out, plain = with_audio.prepare(data, "video/mp4", "vid"), frames_only.prepare(data, "video/mp4", "vid")
    video_tokens = plain.tokens
    assert out.runs == (("video", 12), ("audio", 50), ("video", 4), ("audio", 25))
    assert sum(n for kind, n in out.runs if kind == "video") == video_tokens and out.audio_tokens == 75
    assert out.tokens == 2 + video_tokens + out.audio_tokens  # <audio_bos> runs <audio_eos>
    assert torch.equal(out.inputs["pixel_values_videos"], plain.inputs["pixel_values_videos"])
    track = with_audio.audio.prepare(data, "video/mp4", "vid")  # the track, prepared as an audio item would be
    assert torch.equal(out.inputs["input_features"], track.inputs["input_features"]) and track.tokens == 75
    assert with_audio.fingerprint != frames_only.fingerprint  # the track is part of the item's identity


def test_a_silent_video_is_video_alone_and_a_track_over_the_window_is_refused():
    with_audio, frames_only = omni_video_preparers()
    silent = with_audio.prepare(mp4(), None, "vid")
    assert (
        silent.runs == ()
        and silent.audio_tokens is None
        and silent.tokens == frames_only.prepare(mp4(), None, "v").tokens
    )
    with pytest.raises(MediaTooLargeError) as err:
        with_audio.prepare(mp4_with_audio(frames=31, fps=1), None, "messages[1].content[0]")
    assert err.value.item == "messages[1].content[0]" and err.value.limit == "max_seconds"
