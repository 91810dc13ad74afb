"""Plain transformers on the same weights, for tests and benchmarks to compare against: ``generate`` (no prefix cache,
the stock ``DynamicCache``) on a stock model of its own (:func:`load_stock` for text models,
:func:`load_stock_media` for multimodal ones: the transformers model as loaded from disk, never the serving
runtime's), and a multimodal prompt in the shape transformers takes it (:func:`hf_inputs`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from chat.models.hf.multimodal import MediaPrompt, MultimodalAdapter


@dataclass(frozen=True, slots=True)
class StockModel:
    """A text model exactly as transformers loads it, and its tokenizer."""

    model: Any  # the transformers causal LM, in eval mode
    tokenizer: Any  # its tokenizer, with its chat template
    eos_token_ids: frozenset[int]  # what ends a reply (as the runtime of the same spec has them)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def render(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of text ``messages`` through the chat template, with the generation prompt."""
        from chat.models.renderer import render_chat

        return render_chat(self.tokenizer, messages, True)


def load_stock(spec: str, dtype: str = "float32") -> StockModel:
    """The stock transformers model of a text ``spec`` (``"smollm2"``, ``"tiny-<name>"``, a directory or a GGUF
    file), loaded on its own: what a baseline runs, whatever the serving runtime computes with."""
    from transformers import AutoModelForCausalLM

    from chat.models import registry, renderer_loading, specs

    torch_dtype = specs.parse_dtype(dtype)
    if spec.startswith("tiny-"):
        from chat.models.tiny.text import build_tiny_model

        tokenizer, config = renderer_loading.tiny_text(spec.removeprefix("tiny-"))
        model = build_tiny_model(config, torch_dtype)
    elif (gguf := specs.gguf_file(spec)) is not None:  # the built-in model too: the file's own dequantization
        from chat.models.hf import gguf_model

        model, tokenizer = gguf_model.load_gguf(gguf, "float32")
        model = model.to(torch_dtype).eval()
    else:
        path, _, _ = specs.directory_of(spec)
        tokenizer = renderer_loading.text_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True).eval()
    return StockModel(model, tokenizer, frozenset(registry.eos_ids(model.generation_config, tokenizer)))


def save_stock(spec: str, path: Path) -> None:
    """``spec``'s stock model and tokenizer saved as a model directory (``save_pretrained``)."""
    stock = load_stock(spec)
    stock.model.save_pretrained(str(path))
    stock.tokenizer.save_pretrained(str(path))


def hf_generate(stock: StockModel, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy ``model.generate`` from ``prompt``; returns the new token ids (ending with an EOS id if one was made).
    Stops at the model's EOS ids, as the engine does."""
    ids = torch.as_tensor([list(prompt)], dtype=torch.long, device=stock.device)  # [1, n]
    eos = sorted(stock.eos_token_ids)
    with torch.inference_mode():
        out = stock.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos or None,
            pad_token_id=eos[0] if eos else None,
        )
    return out[0, ids.shape[1] :].tolist()


def hf_inputs(adapter: MultimodalAdapter, prompt: MediaPrompt) -> dict[str, torch.Tensor]:
    """The whole prompt as the transformers model takes it without any cache (``input_ids``, ``attention_mask``
    and each kind's batched media inputs): the reference that tests and benchmarks compare against."""
    by_kind: dict[str, list] = {"image": [], "video": [], "audio": []}
    for it in prompt.items:
        by_kind[it.span.kind.value].append(it.prepared)
        if it.prepared.runs:  # a video's audio track: among the audio clips, in prompt order
            by_kind["audio"].append(it.prepared)
    ids = torch.tensor([list(prompt.tokens)], device=adapter.device)
    out: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    images, videos, clips = by_kind["image"], by_kind["video"], by_kind["audio"]
    parameters = inspect.signature(adapter.full_model.forward).parameters
    if images and "pixel_attention_mask" in images[0].inputs:  # tiles (SmolVLM): one sample, every image's tiles
        out["pixel_values"] = torch.cat([p.inputs["pixel_values"] for p in images], dim=1)
        out["pixel_attention_mask"] = torch.cat([p.inputs["pixel_attention_mask"] for p in images], dim=1)
    elif images and "image_sizes" in images[0].inputs:  # any aspect ratio (Pixtral): padded to the largest, sizes kept
        pixels = [p.inputs["pixel_values"] for p in images]  # [1, 3, h, w] each
        height, width = max(x.shape[-2] for x in pixels), max(x.shape[-1] for x in pixels)
        out["pixel_values"] = torch.cat([F.pad(x, (0, width - x.shape[-1], 0, height - x.shape[-2])) for x in pixels])
        out["image_sizes"] = torch.cat([p.inputs["image_sizes"] for p in images])
    elif images:
        out["pixel_values"] = torch.cat([p.inputs["pixel_values"] for p in images])
        if "image_grid_thw" in images[0].inputs:
            out["image_grid_thw"] = torch.cat([p.inputs["image_grid_thw"] for p in images])
    if videos:
        out["pixel_values_videos"] = torch.cat([p.inputs["pixel_values_videos"] for p in videos])
        out["video_grid_thw"] = torch.cat([p.inputs["video_grid_thw"] for p in videos])
        if "video_second_per_grid" in parameters:
            out["video_second_per_grid"] = torch.tensor([p.second_per_grid for p in videos])
    if clips:
        feats = [p.inputs["input_features"] for p in clips]  # [mels, frames] each
        longest = max(f.shape[1] for f in feats)
        batch = torch.zeros(len(feats), feats[0].shape[0], longest)
        mask = torch.zeros(len(feats), longest, dtype=torch.long)
        for i, f in enumerate(feats):
            batch[i, :, : f.shape[1]] = f
            mask[i, : f.shape[1]] = 1
        out["input_features"], out["feature_attention_mask"] = batch, mask
    if any(it.prepared.runs for it in prompt.items):
        out["use_audio_in_video"] = True  # type: ignore[assignment]  # transformers: every video carries its audio
    if adapter.family.bidirectional:  # Gemma 3: its image tokens, whose blocks attend both ways (token_type_ids)
        kinds = torch.zeros_like(ids)
        for it in prompt.items:
            kinds[0, it.span.start : it.span.end] = 1
        out["token_type_ids"] = kinds
    if "mm_token_type_ids" in parameters:  # Qwen3.5, Qwen3-VL: which tokens are image / video placeholders
        kinds = torch.zeros_like(ids)
        for it in prompt.items:
            span = ids[0, it.span.start : it.span.end]
            kind = 1 if it.span.kind.value == "image" else 2
            kinds[0, it.span.start : it.span.end] = (span == adapter.family.placeholders[it.span.kind.value]) * kind
        out["mm_token_type_ids"] = kinds
    return out


def load_stock_media(spec: str) -> Any:
    """The stock transformers model of a multimodal ``spec`` (``tiny-<name>`` or a model directory): the whole
    model (encoders and all), float32, exactly as loaded, a copy of its own."""
    from chat.models import renderer_loading, specs

    if spec.startswith("tiny-"):
        from chat.models.tiny.media import build_tiny_multimodal

        model, _, _ = build_tiny_multimodal(spec.removeprefix("tiny-"), torch.float32)
    else:
        from chat.models.hf.families_mm import load_multimodal

        path, _, _ = specs.directory_of(spec)
        model, _, _ = load_multimodal(path, renderer_loading.read_config(path), torch.float32)
    return model.eval()


def hf_generate_media(stock: Any, adapter: MultimodalAdapter, prompt: MediaPrompt, max_new_tokens: int) -> list[int]:
    """Greedy transformers ``generate`` of the stock model ``stock`` (:func:`load_stock_media`) on the whole prompt
    with its media (no prefix cache), the prompt laid out as ``adapter`` renders it. Returns the new token ids."""
    eos = sorted(adapter.eos_token_ids)
    with torch.inference_mode():
        inputs = hf_inputs(adapter, prompt)
        out = stock.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos or None,
            pad_token_id=eos[0] if eos else None,
        )
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def buffer_copies(adapter: Any, run: Any) -> int:
    """How many times the run's attention layers had to copy rows into a fresh buffer (copy-on-write tests)."""
    state = run.state
    layers = state if isinstance(state, list) else [getattr(layer, "rows", None) for layer in state.layers]
    return sum(rows.copies for rows in layers if rows is not None)
