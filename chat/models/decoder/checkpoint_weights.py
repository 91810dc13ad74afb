"""A model directory's checkpoint read straight into the own decoder, through its one name map
(:data:`chat.models.decoder.names.CHECKPOINT_NAMES`): no transformers model in between, as a GGUF file's tensors are
read (:mod:`chat.models.decoder.gguf_weights`).

One directory, step by step::

    family      decoder_args(config): a family or setting the decoder does not compute -> None (logged), before
                any file is opened
    files       ``model.safetensors``, else the shards ``model.safetensors.index.json`` lists (one it lists that is
                missing: ModelLoadError naming it); neither (a ``.bin`` checkpoint): None (logged)
    tensors     every tensor of every file, cast to the dtype asked for as transformers casts them when it loads
                them (a file that is not safetensors, truncated, or lacks a tensor the index places in it:
                ModelLoadError naming the file)
    names       CHECKPOINT_NAMES, in build_decoder: a tensor the map does not know, or one the decoder needs that
                the checkpoint lacks -> None (logged)
    LM head     the checkpoint's ``lm_head.weight``; without one, the embedding when the config ties them
                (``tie_word_embeddings``), else None (logged). As transformers reads them: a tied config whose
                checkpoint holds a head of other values gets that head (transformers then unties them)

The weights are then the tensors transformers' model would hold, and :func:`build_decoder` makes of them the decoder
it makes of that model's state dict: the same logits, bit for bit, in every dense format (float32, bfloat16, int8 with
its smoothing calibration). Where this returns None, the registry loads the directory through transformers' model, as
before (:func:`chat.models.registry.load_directory`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from chat.models.decoder.model import Decoder, NotPackable, build_decoder, decoder_args
from chat.models.errors import ModelLoadError
from chat.models.smoothing import CALIBRATION_TEXT

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # {"weight_map": {tensor name: shard file name}}
HEAD = "lm_head.weight"  # the checkpoint's name of the LM head

_log = logging.getLogger(__name__)


def build_from_directory(
    path: Path, config: Any, tokenizer: Any, weights: str, *, dtype: Any, device: Any = None
) -> Decoder | None:
    """The own decoder read straight from the checkpoint in the model directory ``path`` (``config``: its config,
    ``tokenizer``: its tokenizer, for int8's calibration; ``weights``: a dense weight format; ``dtype``, ``device``:
    what its tensors become), or None when it does not read this directory (see the module docstring: logged).

    Raises:
        ModelLoadError: a shard the index names is missing, or a checkpoint file cannot be read (named).
    """
    try:
        decoder_args(config)
    except NotPackable as exc:
        _log.info("%s is read through transformers' model: %s", path, exc)
        return None
    files = checkpoint_files(path)
    if files is None:
        _log.info("%s is read through transformers' model: it holds no %s or %s", path, SINGLE_FILE, INDEX_FILE)
        return None
    state = read_tensors(path, files, dtype)
    if HEAD not in state and not getattr(config, "tie_word_embeddings", False):
        _log.info(
            "%s is read through transformers' model: no %s, and the config ties no head to the embedding", path, HEAD
        )
        return None  # (transformers' model then starts its head from random values, and says so)
    if device is not None and device.type != "cpu":
        state = {name: t.to(device) for name, t in state.items()}
    calibration = list(tokenizer.encode(CALIBRATION_TEXT, add_special_tokens=False)) if weights == "int8" else None
    try:
        return build_decoder(config, state, weights, calibration=calibration)
    except NotPackable as exc:
        _log.info("%s is read through transformers' model: %s", path, exc)
        return None


def checkpoint_files(path: Path) -> dict[Path, set[str] | None] | None:
    """The safetensors files of the model directory ``path``, each with the tensor names the index places in it
    (None: a single file, whose names are its own), as transformers picks them: ``model.safetensors``, else the
    shards of ``model.safetensors.index.json``; None when there is neither.

    Raises:
        ModelLoadError: the index cannot be read, or a shard it lists is missing (named).
    """
    if (path / SINGLE_FILE).is_file():
        return {path / SINGLE_FILE: None}
    index = path / INDEX_FILE
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards: dict[Path, set[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(path / str(shard), set()).add(str(name))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"cannot read the checkpoint index {index}: {exc!r}") from exc
    missing = sorted(shard.name for shard in shards if not shard.is_file())
    if missing:
        raise ModelLoadError(f"{path}: the checkpoint shard {missing[0]} that {INDEX_FILE} lists is missing")
    return dict(sorted(shards.items()))


def read_tensors(path: Path, files: dict[Path, set[str] | None], dtype: Any) -> dict[str, torch.Tensor]:
    """Every tensor of ``files`` (:func:`checkpoint_files` of ``path``), by its checkpoint name, in ``dtype``.

    Raises:
        ModelLoadError: a file is not safetensors, is truncated, or lacks a tensor the index places in it (named).
    """
    state: dict[str, torch.Tensor] = {}
    for file, placed in files.items():
        try:
            with safe_open(str(file), framework="pt") as f:
                held = set(f.keys())
                for name in sorted(held):
                    state[name] = f.get_tensor(name).to(dtype)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"cannot read the checkpoint file {file}: {exc}") from exc
        if placed is not None and not placed <= held:
            lacking = sorted(placed - held)[0]
            raise ModelLoadError(f"the checkpoint file {file} lacks {lacking}, which {path / INDEX_FILE} places there")
    return state
