"""Model fingerprints: the cache namespace's model id. Two adapters share cached state only if everything that turns
tokens into state is the same: the weights, the config, the tokenizer and chat template (its digest: ``--chat-template``
gives a model another namespace; a base model's is ``none``), this adapter's way of laying
out the state (:data:`LAYOUT_VERSION`), the format the linear layers run in (float32, bfloat16, int8: each computes
slightly different states), and the forward (turncache's own decoder or transformers'). The dtype is not part of
it: namespaces carry it separately.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from chat.models import chat_template

LAYOUT_VERSION = "turncache-adapter-1"  # bump when exported layer states change meaning
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "_commit_hash"}


def weight_files_digest(directory: Path) -> str:
    """sha256 over the weight files of a model directory (names and bytes, in name order)."""
    h = hashlib.sha256()
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    for path in files:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over named tensors (names, dtypes, shapes, bytes), for weights built in memory."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def model_fingerprint(
    name: str, config: Any, tokenizer: Any, weights_digest: str, weights: str = "float32", forward: str | None = None
) -> str:
    """``<name>@<24 hex digits>`` (``<name>+<format>@...`` when the linear layers run in another weight format
    than float32): readable in logs, unique across weights, their format, config and tokenizer, and the forward
    that computes the states (``forward``: e.g. :data:`chat.models.decoder.model.DECODER_VERSION`; None for
    transformers' forward), whose last bits differ from one forward to another."""
    h = hashlib.sha256(LAYOUT_VERSION.encode())
    h.update(f"weights={weights}".encode())
    if forward is not None:
        h.update(f"forward={forward}".encode())
    config_dict = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    h.update(json.dumps(config_dict, sort_keys=True, default=str).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update(
        backend.to_str().encode() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    )
    h.update(f"chat_template={chat_template.digest(chat_template.template_of(tokenizer))}".encode())
    h.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    h.update(weights_digest.encode())
    label = name if weights == "float32" else f"{name}+{weights}"
    return f"{label}@{h.hexdigest()[:24]}"
