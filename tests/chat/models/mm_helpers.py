"""Media and reference forwards for the multimodal model tests."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from modalities.parts import MediaInput
from tests.modalities.helpers import av_video, sf_audio


def png(seed: int, width: int = 60, height: int = 50) -> bytes:
    rng = np.random.RandomState(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.rand(height, width, 3) * 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def wav(seconds: float = 0.6) -> bytes:
    return sf_audio("WAV", "PCM_16", seconds=seconds)


def mp4(frames: int = 12) -> bytes:
    return av_video("mp4", "libx264", frames=frames, fps=10, width=64, height=48)


def image(data: bytes, item: str = "img") -> MediaInput:
    return MediaInput.from_bytes("image", data, None, item)


def audio(data: bytes, item: str = "aud") -> MediaInput:
    return MediaInput.from_bytes("audio", data, None, item)


def video(data: bytes, item: str = "vid") -> MediaInput:
    return MediaInput.from_bytes("video", data, None, item)


def user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, MediaInput) else {"type": "text", "text": p} for p in parts]}


def reference_logits(adapter, prompt) -> torch.Tensor:
    """Logits ``[len(prompt.tokens), vocab]`` of the whole prompt through the transformers model (no cache), with
    the model's own media merging and position ids."""
    with torch.inference_mode():
        out = adapter.full_model(**adapter.hf_inputs(prompt))
    return out.logits[0].float()
