"""Checks shared by the tests of chat.models.decoder.gguf_weights: a file read through the decoder's name map
against transformers' own loading of it, and a model loaded from it against the same file loaded through
transformers' model and the checkpoint names (the path the name map replaced, kept as the loader of the families
the decoder does not read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from chat.models import gguf_files, load_model
from chat.models.decoder import gguf_weights, names
from chat.models.decoder.model import decoder_args
from chat.models.hf import gguf_model
from tests.chat.models.helpers import default_blas_forms


def read(path: Path, blocks: bool) -> tuple[gguf_weights.FileWeights, object]:
    header = gguf_files.read_header(path)
    config, _ = gguf_model.metadata(path, header, gguf_files.identify(path).sha256)
    args = decoder_args(config)
    return gguf_weights.read_weights(path, header, args, tied=config.tie_word_embeddings, blocks=blocks), args


def transformers_loading(path: Path, weights: str) -> tuple[dict[str, torch.Tensor], dict[str, object], object]:
    """What transformers' loader fills its model with: its state dict under our names, and the blocks its linear
    layers keep (our name -> BlockWeight)."""
    model, _ = gguf_model.load_gguf(path, weights, gguf_files.identify(path).sha256)
    args = decoder_args(model.config)
    state, unknown = names.from_checkpoint(model.state_dict(), sandwich=args.spec.sandwich)
    assert unknown == []
    modules = dict(model.named_modules())
    kept = {}
    for ours in state:
        stem = ours.removesuffix(".weight")
        if ours.endswith(".weight") and stem.rpartition(".")[2] in (*names.MATRIX_PARTS, "head"):
            block = getattr(modules[names.checkpoint_module(stem)], "block_weight", None)
            if block is not None:
                kept[ours] = block
    return state, kept, model.get_input_embeddings()


def assert_read_as_transformers_reads(path: Path, blocks: bool) -> None:
    ours, _ = read(path, blocks)
    theirs, kept, embedding = transformers_loading(path, "gguf" if blocks else "float32")
    assert set(ours.state) == set(theirs)
    for name, tensor in theirs.items():
        if tensor.is_meta or ours.state[name].is_meta:  # a matrix kept in blocks: never dequantized by either
            assert tensor.is_meta and ours.state[name].is_meta and name in kept, name
            continue
        assert torch.equal(ours.state[name], tensor), name
    assert set(ours.kept) == set(kept)
    for name, block in kept.items():
        assert (ours.kept[name].qtype, ours.kept[name].shape) == (block.qtype, block.shape), name
        assert np.array_equal(ours.kept[name].raw, block.raw), name
    theirs_table = getattr(embedding, "file_blocks", None)
    assert (ours.embedding is None) == (theirs_table is None)
    if theirs_table is not None:
        assert np.array_equal(ours.embedding.raw, theirs_table.raw)


def through_transformers(spec: str, **kwargs):
    """``load_model`` as it was: the file into transformers' model, then the decoder from its checkpoint names."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_weights, "build_from_file", lambda *args, **kw: None)
        return load_model(spec, **kwargs)


def assert_same_model(spec: str, tokens: list[int], **kwargs) -> None:
    """``spec`` loaded both ways gives the same model (both loads with the default BLAS forms: a float32 load picks
    them by timing, and they round differently, :func:`tests.chat.models.helpers.default_blas_forms`)."""
    with default_blas_forms():
        assert_same_adapters(load_model(spec, **kwargs), through_transformers(spec, **kwargs), tokens)


def assert_same_adapters(new, old, tokens: list[int]) -> None:
    """Two loads of one file (read through the name map, and through transformers' model) give the same model: the
    same fingerprint, settings and logits, bit for bit."""
    assert type(new._model).__name__ == "Decoder" and type(old._model).__name__ == "Decoder"
    assert (new.fingerprint, new.dtype, new.eos_token_ids, new.context_window) == (
        old.fingerprint,
        old.dtype,
        old.eos_token_ids,
        old.context_window,
    )
    assert new.generation_defaults == old.generation_defaults
    logits = []
    for model in (new, old):
        run = model.new_run()
        logits.append(torch.cat([model.forward(run, tokens[:-3]), model.forward(run, tokens[-3:])]))
        model.close_run(run)
    assert torch.equal(*logits)
