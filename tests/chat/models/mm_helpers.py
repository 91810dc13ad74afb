"""Media and reference forwards for the multimodal model tests."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from modalities.parts import MediaPart
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


def image(data: bytes, item: str = "img") -> MediaPart:
    return MediaPart("image", data, None, item)


def audio(data: bytes, item: str = "aud") -> MediaPart:
    return MediaPart("audio", data, None, item)


def video(data: bytes, item: str = "vid") -> MediaPart:
    return MediaPart("video", data, None, item)


def user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, MediaPart) else {"type": "text", "text": p} for p in parts]}


def reference_logits(adapter, prompt) -> torch.Tensor:
    """Logits ``[len(prompt.tokens), vocab]`` of the whole prompt through the transformers model (no cache), with
    the model's own media merging and position ids."""
    kwargs: dict = {}
    by_kind: dict[str, list] = {"image": [], "video": [], "audio": []}
    for it in prompt.items:
        by_kind[it.span.kind.value].append(it.prepared)
    family = adapter.family.name
    if by_kind["image"]:
        kwargs["pixel_values"] = torch.cat([p.inputs["pixel_values"] for p in by_kind["image"]])
        if family != "llava":
            kwargs["image_grid_thw"] = torch.cat([p.inputs["image_grid_thw"] for p in by_kind["image"]])
    if by_kind["video"]:
        kwargs["pixel_values_videos"] = torch.cat([p.inputs["pixel_values_videos"] for p in by_kind["video"]])
        kwargs["video_grid_thw"] = torch.cat([p.inputs["video_grid_thw"] for p in by_kind["video"]])
        kwargs["video_second_per_grid"] = torch.tensor([p.second_per_grid for p in by_kind["video"]])
    if by_kind["audio"]:
        feats = [p.inputs["input_features"] for p in by_kind["audio"]]
        longest = max(f.shape[1] for f in feats)
        batch = torch.zeros(len(feats), feats[0].shape[0], longest)
        mask = torch.zeros(len(feats), longest, dtype=torch.long)
        for i, f in enumerate(feats):
            batch[i, :, : f.shape[1]] = f
            mask[i, : f.shape[1]] = 1
        kwargs["input_features"] = batch
        kwargs["feature_attention_mask"] = mask
    ids = torch.tensor([list(prompt.tokens)])
    with torch.inference_mode():
        out = adapter.full_model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    return out.logits[0].float()
