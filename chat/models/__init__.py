"""Model adapters: the only package of turncache that imports transformers (and only when a model is loaded).

Public surface::

    load_model(spec, dtype="float32", weights=None, kv_dtype=None) -> ModelAdapter   # "smollm2", "tiny-<name>",
                                                            # a model directory, a GGUF file
    load_renderer(spec) -> TemplateRenderer   # the same model's name, modalities and render, without weights
    ModelAdapter   name, fingerprint, dtype, weights, context_window, eos_token_ids, vocab_size, modalities,
                   has_recurrent_state, render, render_prompt, decode, detokenizer, new_run, forward_batch,
                   forward, snapshot, export, extras, close_run, can_rewind, rewind (speculative decoding),
                   stock_model (baselines, float32 weights only)
    RunState       one generation's live state (``.length``)
    errors         ModelError and its subclasses (chat.models.errors)

Module map: ``registry`` (specs -> loaders), ``renderer`` (the chat template alone, for a cluster's ingress),
``gguf_files`` (any GGUF file -> model directory, once per file), ``smollm2`` (the built-in GGUF), ``tiny`` +
``tiny_tokenizer`` (seeded test models), ``families`` (what is served or refused), ``adapter`` (the runtime),
``hf_cache`` (a transformers Cache over ``kv_rows``' copy-on-write buffers), ``ragged`` (several runs in one forward,
each attending to its own rows), ``fast_paths`` (every patch of the transformers model in one ``install``: weight
formats, fused projections, the packed attention; undone for baselines), ``smoothing`` (activation outliers into the
weights before int8), ``detokenizer``, ``fingerprint``, ``baseline`` (plain ``generate`` for benchmarks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chat.models.errors import (
    InvalidSettingError,
    ModelError,
    ModelFileError,
    ModelLoadError,
    RunStateError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from chat.models.registry import load_model, load_renderer

if TYPE_CHECKING:
    from chat.models.adapter import ModelAdapter, RunState

__all__ = [
    "InvalidSettingError",
    "ModelAdapter",
    "ModelError",
    "ModelFileError",
    "ModelLoadError",
    "RunState",
    "RunStateError",
    "UnknownModelError",
    "UnsupportedArchitectureError",
    "load_model",
    "load_renderer",
]


def __getattr__(name: str) -> Any:  # ModelAdapter / RunState pull in torch and transformers: only on demand
    if name in ("ModelAdapter", "RunState"):
        from chat.models import adapter

        return getattr(adapter, name)
    raise AttributeError(f"module 'chat.models' has no attribute {name!r}")
