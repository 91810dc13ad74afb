"""A GGUF file loaded straight from its bytes as a transformers model: no copy written to disk. The config and
tokenizer of every GGUF file come from here (:func:`metadata`); the tensors of a file the own decoder reads itself
(its families, the architectures of ``chat.models.decoder.names.GGUF_LAYOUTS``) do not: it reads them through its
own name map (``chat.models.decoder.gguf_weights``). This loader serves the rest (hybrid recurrent families, files
the decoder's map does not cover) and stays the oracle the decoder's reading is tested against.

One load, step by step::

    read_header + check_header   metadata and tensor table checked before any weights are read: typed errors for a
                                 truncated file, an unknown tensor type, an architecture not served, or tensor
                                 shapes that disagree with the metadata (chat.models.gguf_files)
    config, tokenizer            built by transformers from the metadata (nothing executed: GGUF holds no code);
                                 kept by the file's sha256 for later loads of the same bytes, in this process or
                                 another (chat.models.hf.metadata_store)
    model on the meta device     the family's transformers model, without memory for its weights (its
                                 buffers, e.g. rope frequencies, computed as usual)
    tensors                      read from a memory map of the file (the table read_header checked) through
                                 transformers' name map
                                 and per-architecture fixes (llama's q/k row order, gemma's norms), one at a time:
                                 - a linear layer's weight in a type with a kernel (block_matrices
                                   .KERNEL_TYPES: every Q2_K ... Q8_0 and IQ4 type, F16, BF16), when the format
                                   asked for is one of block_matrices.BLOCK_FORMATS: kept as the file's blocks
                                   (``layer.block_weight``; rows reordered as the architecture's fix reorders
                                   them), never dequantized
                                 - every other tensor (embeddings, norms, a type without a kernel): dequantized in
                                   memory (gguf-py), in float32
    embedding                    dequantized into the model too, and marked with its blocks (``file_blocks``,
                                 checked on a sample of rows): in every format but float32 the own decoder's
                                 lookups read those (a tied head's packed rows, or a copy of the file's blocks;
                                 chat.models.kernels.block_matrices.BlockEmbedding) and the float32 table goes
    tied LM head                 with tied embeddings the head reads the embedding's blocks (and the lookup its
                                 dequantization), as llama.cpp does

A type without a kernel is named in a warning (the layers it holds run in float32). Architectures that transformers
reads with its newer loader (``transformers.integrations.gguf.GGUF_ARCHS``: LFM2, Qwen3.5) and recurrent families
are dequantized whole by transformers, in memory; a block format then runs them in float32 (warned).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from chat.models import gguf_files
from chat.models.errors import ModelFileError, ModelLoadError
from chat.models.hf import metadata_store
from chat.models.kernels import block_matrices

_log = logging.getLogger(__name__)


def load_gguf(path: Path, weights: str, digest: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the GGUF file ``path`` (checked first), the model in float32 eval mode with the
    linear layers that keep their blocks marked for ``weights`` (see the module docstring). With the file's
    ``digest`` (sha256), the config and tokenizer transformers built for the same bytes before are recalled
    (:func:`metadata`): parsing the metadata takes seconds (SmolLM2's 49k-token vocabulary, several passes).

    Raises:
        ModelFileError, UnsupportedArchitectureError: see :func:`chat.models.gguf_files.check_header`.
        ModelLoadError: the tensors do not fill the model, or transformers failed to read the file.
    """
    header = gguf_files.read_header(path)
    config, tokenizer = metadata(path, header, digest)
    blocks = weights in block_matrices.BLOCK_FORMATS
    if not _own_loader(header.architecture, config):
        if blocks:
            _log.warning(
                "%s: %s files are dequantized whole by transformers: %s runs in float32",
                path,
                header.architecture,
                weights,
            )
        return _dequantized_by_transformers(path), tokenizer
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):  # parameters on the meta device, buffers (rope) computed
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _fill(model, path, header, config, blocks)
    model.eval()
    return model, tokenizer


def metadata(path: Path, header: Any, digest: str | None) -> tuple[Any, Any]:
    """The file's config (once its header passed every check) and tokenizer, built by transformers from the
    metadata (the own decoder's GGUF path reads its tensors itself: chat.models.decoder.gguf_weights). With the
    file's ``digest`` (sha256), a pair built before for the same bytes, in this process or an earlier one, is
    recalled (:mod:`chat.models.hf.metadata_store`: a parse of Gemma 3 270M's metadata takes ~15 s) and its family
    checked again; a pair built here is kept for the next load (processes loading the same file at once take turns:
    one parses).

    Raises:
        ModelFileError, UnsupportedArchitectureError: see :func:`chat.models.gguf_files.check_header`.
    """
    if digest is None:
        return _parsed_metadata(path, header)
    with metadata_store.one_at_a_time(digest):  # another process parsing the same file: wait, then recall
        known = metadata_store.recall(digest)
        if known is None:
            config, tokenizer = _parsed_metadata(path, header)
            metadata_store.remember(digest, config, tokenizer)
            return config, tokenizer
    gguf_files.check_header(header, family=False)
    config, tokenizer = known
    gguf_files.check_family(config, path)
    return config, tokenizer


def _parsed_metadata(path: Path, header: Any) -> tuple[Any, Any]:
    with one_metadata_parse():
        config = gguf_files.check_header(header)
        return config, load_tokenizer(path)


@contextmanager
def one_metadata_parse() -> Iterator[None]:
    """While it is open, transformers parses a GGUF file's metadata once: it reads the whole of it (gguf-py's
    GGUFReader, one numpy view per array element) for the config, and again when it picks the tokenizer's class;
    the second read is the first's result (a copy). Gemma 3 270M's metadata (a 262,144-token vocabulary) took
    35.8 s in two reads (20.7 s + 10.7 s), 25.5 s in one (2 vCPUs, 2026-11-27). Calls that read tensors are passed
    through."""
    from transformers import modeling_gguf_pytorch_utils as reader

    original = reader.load_gguf_checkpoint
    parsed: dict[str, Any] = {}

    def once(path: Any, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return original(path, return_tensors, **kwargs)
        key = str(Path(path).resolve())
        if key not in parsed:
            parsed[key] = original(path, return_tensors=False)
        return copy.deepcopy(parsed[key])

    reader.load_gguf_checkpoint = once  # looked up by name where transformers calls it
    try:
        yield
    finally:
        reader.load_gguf_checkpoint = original


def generation_config(config: Any) -> Any:
    """The generation settings transformers' model of ``config`` would carry (its defaults from the config):
    what a model read without transformers' model (the own decoder's GGUF path) is served with."""
    from transformers import GenerationConfig

    return GenerationConfig.from_model_config(config)


def all_in_blocks(model: nn.Module) -> bool:
    """Whether every linear layer of the decoder (the LM head too) keeps its file's blocks."""
    layers = [m for m in model.modules() if type(m) is nn.Linear]
    return bool(layers) and all(getattr(m, "block_weight", None) is not None for m in layers)


def checked_tokenizer(path: Path) -> Any:
    """The file's tokenizer once its header passed every check (a renderer needs no weights).

    Raises:
        ModelFileError, UnsupportedArchitectureError: see :func:`chat.models.gguf_files.check_header`.
    """
    gguf_files.check_magic(path)
    _, tokenizer = metadata(path, gguf_files.read_header(path), gguf_files.identify(path).sha256)
    return tokenizer


def load_tokenizer(path: Path) -> Any:
    """The tokenizer (with its chat template, if the metadata has one) transformers builds from the file's metadata.

    Raises:
        ModelFileError: transformers cannot build a tokenizer from it.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:  # transformers raises what it likes on metadata it does not expect
        raise ModelFileError(path, f"transformers cannot build its tokenizer ({exc})") from exc


# ==================================================================== internals


def _own_loader(architecture: str, config: Any) -> bool:
    """Whether this module reads the tensors itself: transformers' legacy GGUF table (per-architecture tensor
    processors) and a family without recurrent layers."""
    from transformers.integrations.gguf import GGUF_ARCHS

    from chat.models.families import LAYER_KINDS, check_config

    recurrent = any("recurrent" in LAYER_KINDS[kind] for kind in check_config(config))
    return architecture not in GGUF_ARCHS and not recurrent


def _dequantized_by_transformers(path: Path) -> Any:
    from transformers import AutoModelForCausalLM, GgufConfig

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent),
            gguf_file=path.name,
            local_files_only=True,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as exc:
        raise ModelLoadError(f"transformers could not read the tensors of {path}: {exc}") from exc
    model.eval()
    return model


def _fill(model: nn.Module, path: Path, header: Any, config: Any, blocks: bool) -> None:
    """Give every parameter of ``model`` (on the meta device) its tensor from the file, keeping the blocks of the
    linear layers that have a kernel when ``blocks``."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config.to_dict())
    tensors = list(gguf_files.tensors(path, header))
    mapping = _name_map(model, processor, [t.name for t in tensors])  # file name -> model parameter name
    linear = {f"{n}.weight": m for n, m in model.named_modules() if type(m) is nn.Linear}
    state: dict[str, torch.Tensor] = {}
    kept: dict[str, block_matrices.BlockWeight] = {}
    dequantized: dict[str, int] = {}  # type name -> tensors dequantized although linear (no kernel)
    for tensor in tensors:
        target = mapping.get(tensor.name)
        if target is None:
            continue
        qtype = tensor.tensor_type.name
        if blocks and target in linear and tensor.data.ndim == 2:
            if qtype in block_matrices.KERNEL_TYPES:
                weight = _blocks(tensor, processor, linear[target], path)
                if weight is not None:
                    kept[target] = weight
                    continue
            elif qtype != "F32":
                dequantized[qtype] = dequantized.get(qtype, 0) + 1
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=values, name=tensor.name)
        state[target] = torch.from_numpy(np.array(result.weights, dtype=np.float32))  # a copy: the map is read-only
    block_matrices.warn_float32_layers(_log, path, dequantized)
    _check_shapes(model, state, kept, path)
    model.load_state_dict(state, strict=False, assign=True)
    for target, weight in kept.items():
        linear[target].block_weight = weight
    embedding = _embedding_table(model, tensors, mapping, state)
    if embedding is not None:
        model.get_input_embeddings().file_blocks = embedding  # the table (dequantized too) in the file's blocks,
        # which lookups may read instead (build_decoder)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        head = model.get_output_embeddings()
        tied = _embedding_blocks(model, tensors, mapping, blocks)
        if head is not None and type(head) is nn.Linear and tied is not None:
            same = embedding is not None and (embedding.qtype, embedding.shape) == (tied.qtype, tied.shape)
            head.block_weight = embedding if same else tied  # one object: the lookups may read the head's rows
    left = [n for n, p in model.named_parameters() if p.is_meta and n not in kept]
    if left:
        raise ModelLoadError(f"the tensors of {path} do not fill the model: {left[:5]} have no values")


class _Flat:
    """A model seen through its parameter names only: transformers' name map then builds gguf-py's table once
    instead of once per submodule (397 times for SmolLM2: ~20 s on a busy machine)."""

    def __init__(self, model: nn.Module) -> None:
        self.config = model.config  # what the map reads the architecture and layer count from
        self._names = dict.fromkeys(model.state_dict())  # parameter and buffer names

    def state_dict(self) -> dict[str, None]:
        return self._names

    def named_children(self) -> list[Any]:
        return []


def _name_map(model: nn.Module, processor: Any, names: list[str]) -> dict[str, str]:
    """File tensor name -> model parameter name (transformers' map: the whole model's walk only if a flat map leaves
    a tensor of the file unnamed)."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    mapping = get_gguf_hf_weights_map(_Flat(model), processor)
    if any(n not in mapping and n not in gguf_files.IGNORED_TENSORS for n in names):
        mapping = get_gguf_hf_weights_map(model, processor)
    return mapping


def _blocks(tensor: Any, processor: Any, layer: nn.Linear, path: Path) -> block_matrices.BlockWeight | None:
    """The tensor's blocks as the layer's weight: rows reordered as the architecture's fix reorders the
    dequantized rows, found by passing the row numbers through it; None when the fix is not a row order."""
    rows, columns = int(tensor.shape[1]), int(tensor.shape[0])  # ggml lists the fastest dimension first
    shape = (layer.out_features, layer.in_features)
    if (rows, columns) != shape:
        raise ModelFileError(
            path, f"tensor {tensor.name} has shape {(rows, columns)} but the metadata makes it {shape}"
        )
    index = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    result = processor.process(weights=index, name=tensor.name)
    if result.name != tensor.name or np.shape(result.weights) != (rows, 1):
        return None
    order = np.asarray(result.weights).reshape(rows).astype(np.int64)
    if not np.array_equal(np.sort(order), np.arange(rows)):
        return None
    data = gguf_files.raw_bytes(tensor.data)
    raw = data if np.array_equal(order, np.arange(rows)) else np.ascontiguousarray(data[order])
    weight = block_matrices.BlockWeight(tensor.tensor_type.name, shape, raw)
    try:
        block_matrices.unpack(weight)  # checks the bytes against the shape
    except ValueError as exc:
        raise ModelFileError(path, f"tensor {tensor.name}: {exc}") from None
    return weight


def _embedding_blocks(model: nn.Module, tensors: list[Any], mapping: dict[str, str], blocks: bool) -> Any:
    """The input embedding's tensor as the tied LM head's blocks (None: not a kernel type, or not asked for)."""
    if not blocks:
        return None
    embedding = model.get_input_embeddings()
    names = {f"{n}.weight" for n, m in model.named_modules() if m is embedding}
    for tensor in tensors:
        if mapping.get(tensor.name) in names and tensor.tensor_type.name in block_matrices.KERNEL_TYPES:
            rows = tensor.data.shape[0]
            shape = (rows, embedding.embedding_dim)
            return block_matrices.BlockWeight(tensor.tensor_type.name, shape, gguf_files.raw_bytes(tensor.data))
    return None


def _embedding_table(
    model: nn.Module, tensors: list[Any], mapping: dict[str, str], state: dict[str, torch.Tensor]
) -> block_matrices.BlockWeight | None:
    """The input embedding's tensor as blocks whose dequantization is the table loaded (checked on a sample of rows:
    an architecture's fix that changed the values would show), or None (a float32 table, or a fix)."""
    import gguf

    embedding = model.get_input_embeddings()
    names = {f"{n}.weight" for n, m in model.named_modules() if m is embedding}
    for tensor in tensors:
        target = mapping.get(tensor.name)
        if target not in names or target not in state or tensor.tensor_type.name in ("F32", "F64"):
            continue
        table = state[target]
        weight = block_matrices.BlockWeight(
            tensor.tensor_type.name, tuple(table.shape), gguf_files.raw_bytes(tensor.data)
        )
        if weight.raw.shape[0] != table.shape[0]:
            return None
        rows = np.unique(np.linspace(0, table.shape[0] - 1, 16).astype(np.int64))
        sample = gguf.quants.dequantize(weight.raw[rows], tensor.tensor_type)
        return weight if torch.equal(torch.from_numpy(np.ascontiguousarray(sample)), table[rows]) else None
    return None


def _check_shapes(model: nn.Module, state: dict[str, torch.Tensor], kept: dict[str, Any], path: Path) -> None:
    """Every tensor must have the shape of the parameter it fills (the metadata made the model)."""
    params = dict(model.named_parameters())
    for name, tensor in state.items():
        want = tuple(params[name].shape) if name in params else None
        if want is not None and tuple(tensor.shape) != want:
            raise ModelFileError(
                path, f"tensor for {name} has shape {tuple(tensor.shape)} but the metadata makes it {want}"
            )
    for name, weight in kept.items():
        want = tuple(params[name].shape)
        if weight.shape != want:
            raise ModelFileError(path, f"tensor for {name} has shape {weight.shape} but the metadata makes it {want}")
