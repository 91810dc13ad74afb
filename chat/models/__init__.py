"""Model adapters: the only package of turncache that imports transformers (and only when a model is loaded).

Public surface::

    load_model(spec, dtype="float32", weights=None, kv_dtype=None, device=None, chat_template=None)
                   -> ModelAdapter   # "smollm2", "gemma3-270m", "tiny-<name>", a model directory, a GGUF file;
                                     # chat_template: a template file or text replacing the model's own
    load_renderer(spec, chat_template=None) -> TemplateRenderer   # the same model's name, modalities and render,
                                                                   # without weights
    ModelAdapter   name, chats (False: a base model, no chat template), fingerprint, kv_dtype (``dtype`` in the
                   runtime protocol), weights, context_window,
                   eos_token_ids, vocab_size, modalities, has_recurrent_state, render, render_prompt, decode,
                   detokenizer, new_run, forward_batch, forward, snapshot, export, extras, close_run, can_rewind,
                   rewind (speculative decoding)
    RunState       one generation's live state (``.length``)
    errors         ModelError and its subclasses (chat.models.errors)

Module map, shared by both paths: ``registry`` (specs -> loaders: ``load_model``), ``specs`` (a spec resolved and
the load's settings checked, no transformers), ``renderer_loading`` (``load_renderer``: a model's tokenizer, config
and template, no weights: a cluster's ingress), ``renderer`` (the chat template alone), ``chat_template``
(``--chat-template``: read, compiled, rendered sandboxed with typed errors; its digest), ``gguf_files`` (any GGUF file
-> model directory, once per file), ``smollm2`` (the built-in GGUF), ``gemma3_270m`` (Gemma 3 270M assembled once
from its chunk packages), ``families`` (what is served or refused), ``adapter`` (what every runtime shares),
``attention`` (the step batch and the attention kernels by name: the one torch attention), ``kv_rows``
(copy-on-write K/V buffers), ``smoothing`` (activation outliers into the weights before int8), ``lora_files`` (LoRA
adapter files), ``detokenizer``, ``fingerprint``, ``prompt_tokens``, ``vocabulary``, ``memory``, ``tiny`` (the seeded
test models). Then the two paths, which never import each other (tests/test_import_graph.py): ``decoder``
(turncache's own forward for the families whose every layer is attention: ``decoder.model``, ``decoder.runtime``
with ``DecoderAdapter``, ``decoder.lora``) and ``hf`` (transformers' forward, for hybrid recurrent and multimodal
models: ``hf.runtime`` with ``TransformersAdapter``, ``hf.run_cache``, ``hf.ragged``, ``hf.fast_paths``,
``hf.multimodal`` / ``hf.families_mm`` / ``hf.media_prep`` / ``hf.mrope``, ``hf.gguf_model`` with
``hf.metadata_store``); and ``kernels`` (the weight formats and the C kernels both compute with).

Importing the package loads neither transformers nor torch: ``load_model``, ``load_renderer``, ``ModelAdapter`` and
``RunState`` come from their modules on first use (PEP 562). It sets ``HF_HUB_OFFLINE=1`` (nothing is ever
downloaded): huggingface_hub reads it once, when first imported, which the loading modules do at their top, after
this package.
"""

from __future__ import annotations

import importlib
import os
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

if TYPE_CHECKING:
    from chat.models.adapter import ModelAdapter, RunState
    from chat.models.registry import load_model
    from chat.models.renderer_loading import load_renderer

os.environ["HF_HUB_OFFLINE"] = "1"  # before any module of the package imports transformers (and huggingface_hub)

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
_ON_DEMAND = {  # name -> its module: torch, transformers and the runtimes load only when one is used
    "ModelAdapter": "chat.models.adapter",
    "RunState": "chat.models.adapter",
    "load_model": "chat.models.registry",
    "load_renderer": "chat.models.renderer_loading",
}


def __getattr__(name: str) -> Any:
    if name in _ON_DEMAND:
        return getattr(importlib.import_module(_ON_DEMAND[name]), name)
    raise AttributeError(f"module 'chat.models' has no attribute {name!r}")
