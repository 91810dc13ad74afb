"""A GGUF file's tensors read straight into the own decoder's weights, through its one name map
(:mod:`chat.models.decoder.names`): no transformers model, no second name map in between.

One file, tensor by tensor (from a memory map of the file: :func:`chat.models.gguf_files.tensors`)::

    name          GGUF_NAMES: the file's name -> ours; a tensor the map does not know -> NotPackable (the registry
                  then loads the file through transformers, whose forward serves it as before)
    shape         checked against the config's sizes: a typed error naming the tensor
    a matrix      (q, k, v, o, gate, up, down, the LM head) in a type with a block kernel, when the weight format is
                  a block format: kept as the file's blocks, its rows put in our order (the layout's row order),
                  never dequantized
    the rest      dequantized in float32 (gguf-py), the architecture's layout undone (names.undo_layout)
    embedding     also kept as the file's blocks (a lookup may read them: BlockEmbedding), and a tied LM head reads
                  the same blocks

The config and the tokenizer still come from transformers, built from the file's metadata
(:func:`chat.models.hf.gguf_model.metadata`): this module reads no metadata.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chat.models import gguf_files
from chat.models.decoder import names
from chat.models.decoder.model import MATRIX_NAMES, Decoder, DecoderArgs, NotPackable, build_decoder, decoder_args
from chat.models.errors import ModelFileError
from chat.models.kernels import block_matrices
from chat.models.smoothing import CALIBRATION_TEXT

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class FileLayer:
    """One linear layer as the block formats build it (``from_layers``): its float weight (a meta tensor when it
    keeps its blocks), its bias, and its blocks (None: computed from the float weight)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    block_weight: block_matrices.BlockWeight | None = None


@dataclass(slots=True)
class FileWeights:
    """What :func:`read_weights` gives :func:`chat.models.decoder.model.build_decoder` (``names_of="decoder"``)."""

    state: dict[str, torch.Tensor]  # our names, parts not fused; meta tensors for matrices kept in blocks
    layers: dict[str, list[FileLayer]]  # our matrix names (layers.{i}.qkv, ..., head) -> their parts
    embedding: block_matrices.BlockWeight | None = None  # the embedding table in the file's blocks
    in_float32: int = 0  # matrices of a block format computed from float32 weights (a type without a kernel)
    kept: dict[str, block_matrices.BlockWeight] = field(default_factory=dict)  # our name -> its blocks


def reads(architecture: str) -> bool:
    """Whether this module reads files of ``architecture`` (its layouts are in :data:`names.GGUF_LAYOUTS`)."""
    return architecture in names.GGUF_LAYOUTS


def build_from_file(
    path: Path, header: Any, config: Any, tokenizer: Any, weights: str, *, dtype: Any, device: Any = None
) -> tuple[Decoder, int] | None:
    """The own decoder read straight from the GGUF file ``path`` (``config`` and ``tokenizer``: transformers' from its
    metadata; ``weights``: the weight format; ``dtype``, ``device``: what its float tensors become), and how many of
    its matrices a block format computes in float32; None when the decoder does not read this file (its
    architecture, its family or settings, a tensor the name map does not know: logged; transformers' loader then
    takes it).

    Raises:
        ModelFileError: see :func:`read_weights`.
    """
    if not reads(header.architecture):
        return None
    tied = bool(getattr(config, "tie_word_embeddings", False))
    calibration = list(tokenizer.encode(CALIBRATION_TEXT, add_special_tokens=False)) if weights == "int8" else None
    try:
        read = read_weights(path, header, decoder_args(config), tied, weights in block_matrices.BLOCK_FORMATS)
        state = read.state
        if dtype != torch.float32 or (device is not None and device.type != "cpu"):
            state = {name: t.to(device=device, dtype=dtype) for name, t in state.items()}
        decoder = build_decoder(
            config,
            state,
            weights,
            calibration=calibration,
            layers=read.layers,
            embedding=read.embedding,
            names_of="decoder",
        )
    except NotPackable as exc:
        _log.info("%s is read through transformers' model: %s", path, exc)
        return None
    return decoder, read.in_float32


def read_weights(path: Path, header: Any, args: DecoderArgs, tied: bool, blocks: bool) -> FileWeights:
    """The decoder's weights from the GGUF file ``path`` (``header``: :func:`chat.models.gguf_files.read_header`,
    of an architecture :func:`reads` takes). ``tied``: the LM head is the embedding (the config's
    ``tie_word_embeddings``; a file's ``output.weight`` is then not read). ``blocks``: the weight format is a block
    format (:data:`chat.models.kernels.block_matrices.BLOCK_FORMATS`).

    Raises:
        NotPackable: a tensor the name map does not know.
        ModelFileError: a tensor whose shape is not the config's, or whose blocks do not fit its shape.
    """
    import gguf

    heads = {"heads": args.heads, "kv_heads": args.kv_heads}
    shapes = expected_shapes(args)
    state: dict[str, torch.Tensor] = {}
    kept: dict[str, block_matrices.BlockWeight] = {}
    no_kernel: dict[str, int] = {}  # type name -> matrices dequantized although a block format (no kernel)
    embedding = None
    for tensor in gguf_files.tensors(path, header):
        if tensor.name in gguf_files.IGNORED_TENSORS:
            continue
        found = names.gguf_target(tensor.name, header.architecture)
        if found is None:
            raise NotPackable(f"{path}: tensor {tensor.name} is not one the decoder reads")
        ours, layout = found
        if tied and ours == "head.weight":
            continue
        shape = (int(tensor.shape[1]), int(tensor.shape[0])) if len(tensor.shape) == 2 else tuple(tensor.shape)
        want = shapes(ours)
        if shape != want:
            raise ModelFileError(path, f"tensor {tensor.name} has shape {shape} but the metadata makes it {want}")
        qtype = tensor.tensor_type.name
        if blocks and _is_matrix(ours):
            if qtype in block_matrices.KERNEL_TYPES:
                kept[ours] = _blocks(tensor, layout, heads, shape, path)
                state[ours] = torch.empty(shape, dtype=torch.float32, device="meta")
                continue
            if qtype != "F32":
                no_kernel[qtype] = no_kernel.get(qtype, 0) + 1
        values = names.undo_layout(gguf.quants.dequantize(tensor.data, tensor.tensor_type), layout, heads)
        state[ours] = torch.from_numpy(np.array(values, dtype=np.float32))  # a copy: the map is read-only
        if ours == "embed" and qtype not in ("F32", "F64") and layout == names.Layout():
            raw = gguf_files.raw_bytes(tensor.data)
            if raw.shape[0] == shape[0]:
                embedding = block_matrices.BlockWeight(qtype, shape, raw)  # its dequantization is the table
    block_matrices.warn_float32_layers(_log, path, no_kernel)
    if tied and "embed" in state:
        state["head.weight"] = state["embed"]
        if blocks and embedding is not None and embedding.qtype in block_matrices.KERNEL_TYPES:
            kept["head.weight"] = embedding  # one object: the lookups may read the head's packed rows
    weights = FileWeights(state, _layers(state, kept, args), embedding, kept=kept)
    weights.in_float32 = sum(1 for parts in weights.layers.values() for p in parts if p.block_weight is None)
    return weights


def expected_shapes(args: DecoderArgs) -> Any:
    """Our name -> the shape the config gives it (``[out, in]`` for a matrix)."""
    per_layer = {
        "attn_norm": (args.hidden,),
        "mlp_norm": (args.hidden,),
        "post_attn_norm": (args.hidden,),
        "post_mlp_norm": (args.hidden,),
        "q_norm": (args.head_dim,),
        "k_norm": (args.head_dim,),
        **args.matrix_shapes,
    }
    top = {"embed": (args.vocab_size, args.hidden), "norm": (args.hidden,), "head": (args.vocab_size, args.hidden)}

    def shape(ours: str) -> tuple[int, ...]:
        stem, _, suffix = ours.rpartition(".") if ours.endswith((".weight", ".bias")) else (ours, "", "")
        leaf = stem.rpartition(".")[2]
        full = per_layer[leaf] if stem.startswith("layers.") else top[leaf]
        return full[:1] if suffix == "bias" else full

    return shape


def _is_matrix(ours: str) -> bool:
    return ours == "head.weight" or (ours.endswith(".weight") and ours.split(".")[-2] in names.MATRIX_PARTS)


def _blocks(
    tensor: Any, layout: names.Layout, heads: dict[str, int], shape: tuple[int, ...], path: Path
) -> block_matrices.BlockWeight:
    """The tensor's blocks, its rows in our order (each row's blocks move whole: a row order needs no
    dequantization). A layout that changes values (``plus_one``) is never a matrix's."""
    assert not layout.plus_one, "a matrix stored with another value layout cannot keep its blocks"
    data = gguf_files.raw_bytes(tensor.data)
    order = names.row_order(layout, shape[0], heads)
    raw = data if order is None else np.ascontiguousarray(data[order])
    weight = block_matrices.BlockWeight(tensor.tensor_type.name, (shape[0], shape[1]), raw)
    try:
        block_matrices.unpack(weight)  # checks the bytes against the shape
    except ValueError as exc:
        raise ModelFileError(path, f"tensor {tensor.name}: {exc}") from None
    return weight


def _layers(
    state: dict[str, torch.Tensor], kept: dict[str, block_matrices.BlockWeight], args: DecoderArgs
) -> dict[str, list[FileLayer]]:
    """Our matrices' parts as the block formats take them (``from_layers``), in output order."""
    out: dict[str, list[FileLayer]] = {}
    for i in range(args.layers):
        for name in MATRIX_NAMES:
            parts = [f"layers.{i}.{p}" for p in names.FUSED.get(name, (name,))]
            if any(f"{p}.weight" not in state for p in parts):
                raise NotPackable(f"layer {i} lacks a part of {name}")
            out[f"layers.{i}.{name}"] = [
                FileLayer(state[f"{p}.weight"], state.get(f"{p}.bias"), kept.get(f"{p}.weight")) for p in parts
            ]
    if "head.weight" not in state:
        raise NotPackable("no LM head")
    out["head"] = [FileLayer(state["head.weight"], None, kept.get("head.weight"))]
    return out
