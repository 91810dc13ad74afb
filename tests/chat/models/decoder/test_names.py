"""chat.models.decoder.names: the one name map, held against what it replaces. Every GGUF tensor name of every
architecture the decoder reads, undone by :func:`names.undo_layout`, gives what transformers' GGUF tensor processor
of that architecture gives (the same bits); the GGUF table and the checkpoint table name the same parameter for
every tensor gguf-py's own name map links; llama.cpp's row interleaving (written independently in gguf_helpers)
is undone; the checkpoint map names a norm by its family's role."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chat.models.decoder import names
from tests.chat.models.gguf_helpers import to_llama_cpp_rows

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
_MODEL_TYPE = {"gemma3": "gemma3"}  # gguf-py's name of a file architecture, where transformers renames it


def processor(architecture: str):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    config = {"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS}
    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)


def sample(key: str, rng: np.random.Generator) -> np.ndarray:
    """Random float32 values shaped as the tensor ``key`` of GGUF_NAMES could be (q rows: heads x head size)."""
    rows = (KV_HEADS if ".attn_k." in key else HEADS) * HEAD_DIM
    return rng.standard_normal((rows, 16) if key.endswith(".weight") and "norm" not in key else (rows,)).astype(
        np.float32
    )


@pytest.mark.parametrize("architecture", sorted(names.GGUF_LAYOUTS))
def test_every_tensor_is_undone_as_transformers_processor_undoes_it(architecture):
    rng = np.random.default_rng(0)
    heads = {"heads": HEADS, "kv_heads": KV_HEADS}
    changed = 0
    for key in names.GGUF_NAMES:
        name = key.replace("{i}", "3")
        values = sample(key, rng)
        ours, layout = names.gguf_target(name, architecture)
        want = processor(architecture).process(weights=values.copy(), name=name).weights
        got = names.undo_layout(values.copy(), layout, heads)
        assert got.dtype == np.float32 and np.array_equal(got, want), (architecture, name, ours)
        changed += not np.array_equal(got, values)
    assert changed == len(names.GGUF_LAYOUTS[architecture])  # each layout listed changes its tensor, no other does


def test_llama_cpps_row_interleaving_is_undone():
    rng = np.random.default_rng(1)
    heads = {"heads": HEADS, "kv_heads": KV_HEADS}
    for n, key in ((HEADS, "blk.{i}.attn_q.weight"), (KV_HEADS, "blk.{i}.attn_k.weight")):
        weight = rng.standard_normal((n * HEAD_DIM, 16)).astype(np.float32)
        stored = to_llama_cpp_rows(weight, n)
        assert not np.array_equal(stored, weight)
        assert np.array_equal(names.undo_layout(stored, names.GGUF_LAYOUTS["llama"][key], heads), weight)


@pytest.mark.parametrize("architecture", sorted(names.GGUF_LAYOUTS))
def test_the_gguf_and_checkpoint_tables_name_the_same_parameter(architecture):
    """For each checkpoint name, gguf-py's own map (what llama.cpp's converter writes) gives the file's name; both of
    our tables must lead to the same decoder parameter."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == _MODEL_TYPE.get(architecture, architecture))
    gguf_map = get_tensor_name_map(arch, 1)
    sandwich = architecture.startswith("gemma")
    linked = 0
    for checkpoint in names.CHECKPOINT_NAMES:
        name = checkpoint.replace("{i}", "0")
        stem, _, suffix = name.rpartition(".")
        in_file = gguf_map.get_name(stem)
        if in_file is None:
            continue  # a tensor this architecture does not have
        ours, _ = names.from_checkpoint({name: torch.zeros(1)}, sandwich=sandwich)
        found = names.gguf_target(f"{in_file}.{suffix}", architecture)
        assert found is not None, f"{architecture}: {in_file}.{suffix} is not in GGUF_NAMES"
        assert found[0] == next(iter(ours)), (architecture, name, in_file)
        linked += 1
    assert linked >= 12


def test_a_norm_of_the_checkpoint_takes_its_familys_role():
    state = {"model.layers.2.post_attention_layernorm.weight": torch.ones(4)}
    assert set(names.from_checkpoint(state, sandwich=False)[0]) == {"layers.2.mlp_norm"}  # Llama: before the MLP
    assert set(names.from_checkpoint(state, sandwich=True)[0]) == {"layers.2.post_attn_norm"}  # Gemma: after attention
    named, unknown = names.from_checkpoint({"model.layers.0.mlp.experts.0.weight": torch.ones(1)}, sandwich=False)
    assert named == {} and unknown == ["model.layers.0.mlp.experts.0.weight"]
    assert names.from_checkpoint({"model.rotary_emb.inv_freq": torch.ones(1)}, sandwich=False) == ({}, [])


def test_the_checkpoint_module_of_a_linear_layer():
    assert names.checkpoint_module("layers.3.q") == "model.layers.3.self_attn.q_proj"
    assert names.checkpoint_module("layers.0.down") == "model.layers.0.mlp.down_proj"
    assert names.checkpoint_module("head") == "lm_head"
