"""Media and reference forwards for the multimodal model tests."""

from __future__ import annotations

import functools
import io
import json
from fractions import Fraction

import numpy as np
import torch
from PIL import Image

from chat.models.tiny.media import build_tiny_multimodal
from chat.tools.testing.baselines import hf_inputs, load_stock_media
from modalities.parts import MediaInput
from tests.modalities.helpers import av_video, sf_audio

# the tiny media models of the media families, one each (tiny-qwen3vlmoe repeats tiny-qwen3vl's media path)
MULTIMODAL = [
    "tiny-omni",
    "tiny-llava",
    "tiny-smolvlm",
    "tiny-qwen35vl",
    "tiny-mistral3",
    "tiny-gemma3mm",
    "tiny-qwen3vl",
]


def png(seed: int, width: int = 60, height: int = 50) -> bytes:
    rng = np.random.RandomState(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.rand(height, width, 3) * 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def wav(seconds: float = 0.6) -> bytes:
    return sf_audio("WAV", "PCM_16", seconds=seconds)


def mp4(frames: int = 12) -> bytes:
    return av_video("mp4", "libx264", frames=frames, fps=10, width=64, height=48)


def mp4_with_audio(frames: int = 12, fps: int = 10, freq: float = 440.0, rate: int = 16_000) -> bytes:
    """An H.264 + AAC (mono) MP4: the frames of :func:`tests.modalities.helpers.video_frame` and a sine as long as
    the video."""
    import av

    from tests.modalities.helpers import video_frame

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as box:
        pictures = box.add_stream("libx264", rate=fps)
        pictures.width, pictures.height, pictures.pix_fmt = 64, 48, "yuv420p"
        sound = box.add_stream("aac", rate=rate)
        sound.layout = "mono"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(video_frame(i, 64, 48), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            box.mux(pictures.encode(frame))
        box.mux(pictures.encode(None))
        t = np.arange(frames * rate // fps) / rate
        samples = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
        for at in range(0, len(samples), 1024):
            chunk = av.AudioFrame.from_ndarray(samples[None, at : at + 1024], format="fltp", layout="mono")
            chunk.sample_rate, chunk.pts, chunk.time_base = rate, at, Fraction(1, rate)
            box.mux(sound.encode(chunk))
        box.mux(sound.encode(None))
    return buf.getvalue()


def image(data: bytes, item: str = "img") -> MediaInput:
    return MediaInput.from_bytes("image", data, None, item)


def audio(data: bytes, item: str = "aud") -> MediaInput:
    return MediaInput.from_bytes("audio", data, None, item)


def video(data: bytes, item: str = "vid") -> MediaInput:
    return MediaInput.from_bytes("video", data, None, item)


def user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, MediaInput) else {"type": "text", "text": p} for p in parts]}


@functools.cache
def stock_media(spec: str):
    """The stock transformers model of the tiny multimodal ``spec`` (a copy of its own, as loaded)."""
    return load_stock_media(spec)


def reference_logits(adapter, prompt) -> torch.Tensor:
    """Logits ``[len(prompt.tokens), vocab]`` of the whole prompt through the transformers model (no cache), with
    the model's own media merging, position ids and attention masks (the stock model: transformers' own attention,
    e.g. Gemma 3's blocks of image tokens that attend both ways)."""
    with torch.inference_mode():
        out = stock_media(adapter.name)(**hf_inputs(adapter, prompt))
    return out.logits[0].float()


def save_tiny(name: str, path) -> None:
    """``tiny-<name>`` saved as a model directory, its processor settings in the files the real models ship."""
    model, tokenizer, family = build_tiny_multimodal(name, torch.float32)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    (path / "chat_template.jinja").write_text(tokenizer.chat_template)
    settings: dict = {}
    preparers = dict(family.preparers)
    if name in ("qwen3vl", "qwen3vlmoe", "qwen35vl"):  # video settings in their own file, as Qwen3-VL ships them
        video_preparer = preparers.pop("video")
        video_settings = json.loads(video_preparer.processor.to_json_string())
        video_settings["max_frames"] = video_preparer.options.num_frames
        (path / "video_preprocessor_config.json").write_text(json.dumps(video_settings))
    for preparer in preparers.values():
        processor = getattr(preparer, "processor", None) or getattr(preparer, "extractor", None)
        settings.update(json.loads(processor.to_json_string()))
    if name == "omni":  # one merged file with the pixel budget as min/max_pixels, as Qwen2.5-Omni ships it
        del settings["size"]
        image_proc = family.preparers["image"].processor
        settings["min_pixels"], settings["max_pixels"] = (
            image_proc.size["shortest_edge"],
            image_proc.size["longest_edge"],
        )
        video_proc = family.preparers["video"].processor
        (path / "video_preprocessor_config.json").write_text(
            json.dumps(
                {
                    "min_pixels": video_proc.size["shortest_edge"],
                    "max_pixels": video_proc.size["longest_edge"],
                    "max_frames": family.preparers["video"].options.num_frames,
                }
            )
        )
    (path / "preprocessor_config.json").write_text(json.dumps(settings))
