"""Which model families the adapter serves, which it refuses and why. Decided from the config alone, before any
weights are read.

A family is served when every decoder layer's cache kind is one the adapter can store and restore exactly (see
:data:`LAYER_KINDS`) and the family is not listed in :data:`REFUSED`. The families below were checked on CPU with
tiny random models (``tiny-<name>``); other families whose layers map onto the same kinds are accepted as well.
"""

from __future__ import annotations

from typing import Any

from chat.models.errors import UnsupportedArchitectureError

# transformers layer type -> what the adapter keeps for it (see chat.models.hf.run_cache)
LAYER_KINDS = {
    "full_attention": ("kv",),
    "sliding_attention": ("rotating",),
    "conv": ("recurrent",),
    "linear_attention": ("recurrent",),
    "hybrid": ("kv", "recurrent"),
    "hybrid_sliding": ("rotating", "recurrent"),
    "dummy": ("none",),
}

# model_type -> (its tiny test model, the cache kinds it exercises); checked on CPU with transformers 5.23
SUPPORTED = {
    "llama": ("tiny-llama", "full attention"),
    "mistral": ("tiny-mistral", "sliding window"),
    "qwen2": ("tiny-qwen2", "full attention with q/k/v biases"),
    "qwen3": ("tiny-qwen3", "full attention + sliding window, q/k norms"),
    "gemma2": ("tiny-gemma2", "sliding window + full attention, soft-capped scores and logits"),
    "gemma3_text": ("tiny-gemma3", "sliding window + full attention"),
    "qwen3_next": ("tiny-qwen3next", "gated delta-net linear attention + full attention"),
    "lfm2": ("tiny-lfm2", "short convolutions + full attention"),
    "falcon_h1": ("tiny-falconh1", "Mamba-2 and attention in every layer"),
    "granitemoehybrid": ("tiny-granitemoehybrid", "Mamba-2 layers + attention layers, MoE"),
    "zamba2": ("tiny-zamba2", "Mamba-2 layers + shared attention blocks"),
}

REFUSED = {
    "mamba": "its Mamba-1 mixer ignores the cached recurrent state when continuing with more than one token",
    "falcon_mamba": "its Mamba-1 mixer ignores the cached recurrent state when continuing with more than one token",
    "jamba": "its Mamba-1 mixers ignore the cached recurrent state when continuing with more than one token",
    "recurrent_gemma": "it keeps its recurrent state outside the transformers Cache, so it cannot be restored",
    "mamba2": "pure Mamba-2 models take `cache_params` and no position ids; only hybrids with attention are served",
    "llama4_text": "chunked attention is not stored by this adapter",
}


def supported_families() -> list[str]:
    return sorted(SUPPORTED)


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else config


def check_config(config: Any) -> list[str]:
    """The decoder's transformers layer types if the adapter can serve this config.

    Raises:
        UnsupportedArchitectureError: a refused family, a layer kind the adapter cannot store, multimodal
            position ids (mRoPE), or not a decoder-only language model.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    model_type = str(getattr(config, "model_type", "unknown"))
    text = _text_config(config)
    text_type = str(getattr(text, "model_type", model_type))
    for name in (model_type, text_type):
        if name in REFUSED:
            raise UnsupportedArchitectureError(name, REFUSED[name], supported_families())
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedArchitectureError(
            model_type, "encoder-decoder models are not chat decoders", supported_families()
        )
    if text is not config or any(hasattr(config, k) for k in ("vision_config", "audio_config")):
        raise UnsupportedArchitectureError(
            model_type,
            "multimodal models are served by chat.models.hf.families_mm, not the text adapter",
            supported_families(),
        )
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(rope, dict) and "mrope_section" in rope:
        raise UnsupportedArchitectureError(model_type, "3-D (mRoPE) position ids are not handled", supported_families())
    try:
        layer_types, _ = get_layer_types_and_kwargs(text)
    except Exception as exc:  # a config transformers itself cannot map onto cache layers
        raise UnsupportedArchitectureError(
            model_type, f"its cache layout is unknown ({exc})", supported_families()
        ) from exc
    unknown = sorted(set(layer_types) - set(LAYER_KINDS))
    if unknown:
        raise UnsupportedArchitectureError(
            model_type, f"layer kinds {unknown} cannot be cached by this adapter", supported_families()
        )
    return list(layer_types)
