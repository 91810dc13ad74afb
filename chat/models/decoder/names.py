"""The one name map of the own decoder: from a checkpoint's parameter names (the Hugging Face layout) and from a GGUF
file's own tensor names (llama.cpp's) to the decoder's parameters, with every layout change a GGUF architecture
needs written beside the names it applies to.

The decoder's names (before q/k/v and gate/up are fused: :data:`FUSED`)::

    embed  norm  head.weight                                    the embedding, the final norm, the LM head
    layers.{i}.attn_norm  layers.{i}.mlp_norm                   the norms before attention and before the MLP
    layers.{i}.post_attn_norm  layers.{i}.post_mlp_norm         after them (Gemma 2 and 3: the "sandwich")
    layers.{i}.q_norm  layers.{i}.k_norm                        per head, before the rotation (Qwen3, Gemma 3)
    layers.{i}.{q,k,v,o,gate,up,down}.{weight,bias}             the linear layers (a bias where the family has one)

A checkpoint (:data:`CHECKPOINT_NAMES`) names a norm by its place (``post_attention_layernorm`` is the norm before
the MLP in a Llama-style layer and the norm after attention in Gemma's, which has a ``pre_feedforward_layernorm``
before the MLP); a GGUF file (:data:`GGUF_NAMES`) names it by its role (``ffn_norm`` is always the norm before the
MLP), so its map needs no family. Tensors a GGUF architecture stores in another layout than the checkpoint the
decoder reads are listed per architecture in :data:`GGUF_LAYOUTS` (the architectures the decoder reads a file of:
its keys), as llama.cpp's converter writes them and transformers' GGUF loader undoes them (the same arithmetic, so
the same bits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# ==================================================================== a checkpoint (the Hugging Face layout)

# checkpoint name -> ours; "{i}" is the layer
CHECKPOINT_NAMES = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "norm",
    "lm_head.weight": "head.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.q.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "layers.{i}.q.bias",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.k.weight",
    "model.layers.{i}.self_attn.k_proj.bias": "layers.{i}.k.bias",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.v.weight",
    "model.layers.{i}.self_attn.v_proj.bias": "layers.{i}.v.bias",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.o.weight",
    "model.layers.{i}.self_attn.o_proj.bias": "layers.{i}.o.bias",
    "model.layers.{i}.self_attn.q_norm.weight": "layers.{i}.q_norm",
    "model.layers.{i}.self_attn.k_norm.weight": "layers.{i}.k_norm",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.post_attention_layernorm",  # see its role below
    "model.layers.{i}.pre_feedforward_layernorm.weight": "layers.{i}.mlp_norm",
    "model.layers.{i}.post_feedforward_layernorm.weight": "layers.{i}.post_mlp_norm",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.gate.weight",
    "model.layers.{i}.mlp.gate_proj.bias": "layers.{i}.gate.bias",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.up.weight",
    "model.layers.{i}.mlp.up_proj.bias": "layers.{i}.up.bias",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.down.weight",
    "model.layers.{i}.mlp.down_proj.bias": "layers.{i}.down.bias",
}
CHECKPOINT_IGNORED = re.compile(r".*(rotary_emb|embed_scale).*")  # buffers some checkpoints carry; recomputed

# ==================================================================== a GGUF file (llama.cpp's names)

# GGUF tensor name -> ours; "{i}" is the layer (blk.{i})
GGUF_NAMES = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "head.weight",
    "blk.{i}.attn_norm.weight": "layers.{i}.attn_norm",
    "blk.{i}.attn_q.weight": "layers.{i}.q.weight",
    "blk.{i}.attn_q.bias": "layers.{i}.q.bias",
    "blk.{i}.attn_k.weight": "layers.{i}.k.weight",
    "blk.{i}.attn_k.bias": "layers.{i}.k.bias",
    "blk.{i}.attn_v.weight": "layers.{i}.v.weight",
    "blk.{i}.attn_v.bias": "layers.{i}.v.bias",
    "blk.{i}.attn_output.weight": "layers.{i}.o.weight",
    "blk.{i}.attn_output.bias": "layers.{i}.o.bias",
    "blk.{i}.attn_q_norm.weight": "layers.{i}.q_norm",
    "blk.{i}.attn_k_norm.weight": "layers.{i}.k_norm",
    "blk.{i}.post_attention_norm.weight": "layers.{i}.post_attn_norm",
    "blk.{i}.ffn_norm.weight": "layers.{i}.mlp_norm",
    "blk.{i}.post_ffw_norm.weight": "layers.{i}.post_mlp_norm",
    "blk.{i}.ffn_gate.weight": "layers.{i}.gate.weight",
    "blk.{i}.ffn_gate.bias": "layers.{i}.gate.bias",
    "blk.{i}.ffn_up.weight": "layers.{i}.up.weight",
    "blk.{i}.ffn_up.bias": "layers.{i}.up.bias",
    "blk.{i}.ffn_down.weight": "layers.{i}.down.weight",
    "blk.{i}.ffn_down.bias": "layers.{i}.down.bias",
}


@dataclass(frozen=True, slots=True)
class Layout:
    """How a GGUF architecture stores one tensor unlike the checkpoint: what loading it undoes."""

    interleaved_by: str | None = None  # "heads" | "kv_heads": rows interleaved per head for llama.cpp's rope
    plus_one: bool = False  # a norm stored as 1 + w (the checkpoint's w; the decoder's norm_offset adds the 1)


_PER_HEAD_ROPE = {  # llama.cpp's converter interleaves each head's two halves of q and k rows (its rope pairs
    # neighbours; the checkpoint's rotates halves): row h*D + 2j + s of the file is row h*D + s*D/2 + j
    "blk.{i}.attn_q.weight": Layout(interleaved_by="heads"),
    "blk.{i}.attn_q.bias": Layout(interleaved_by="heads"),
    "blk.{i}.attn_k.weight": Layout(interleaved_by="kv_heads"),
    "blk.{i}.attn_k.bias": Layout(interleaved_by="kv_heads"),
}
_GEMMA_NORMS = {  # Gemma's norms scale by 1 + w; llama.cpp's converter stores 1 + w, the checkpoint w
    name: Layout(plus_one=True)
    for name in (
        "output_norm.weight",
        "blk.{i}.attn_norm.weight",
        "blk.{i}.attn_q_norm.weight",
        "blk.{i}.attn_k_norm.weight",
        "blk.{i}.post_attention_norm.weight",
        "blk.{i}.ffn_norm.weight",
        "blk.{i}.post_ffw_norm.weight",
    )
}
# GGUF general.architecture -> the tensors it stores in another layout. The architectures whose files the decoder
# reads itself; a file of any other goes through transformers' loader (llama.cpp writes Mistral models as "llama"
# files; gguf-py has no "mistral" architecture whose tensor names would say how such a file is laid out).
GGUF_LAYOUTS: dict[str, dict[str, Layout]] = {
    "llama": _PER_HEAD_ROPE,
    "qwen2": {},
    "qwen3": {},
    "gemma2": _GEMMA_NORMS,
    "gemma3": _GEMMA_NORMS,
}

FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}  # fused matrix -> its parts, in output order
MATRIX_PARTS = ("q", "k", "v", "o", "gate", "up", "down")  # the linear layers of a decoder layer (and "head")


def _patterns(table: Mapping[str, str]) -> list[tuple[re.Pattern[str], str, str]]:
    return [
        (re.compile("^" + re.escape(theirs).replace(r"\{i\}", r"(\d+)") + "$"), theirs, ours)
        for theirs, ours in table.items()
    ]


_CHECKPOINT = _patterns(CHECKPOINT_NAMES)
_GGUF = _patterns(GGUF_NAMES)


def _lookup(patterns: list[tuple[re.Pattern[str], str, str]], name: str) -> tuple[str, str] | None:
    """(our name, the table's key) of ``name``, or None."""
    for pattern, theirs, ours in patterns:
        found = pattern.match(name)
        if found:
            return (ours.replace("{i}", found.group(1)) if found.groups() else ours), theirs
    return None


def from_checkpoint(state: Mapping[str, Any], sandwich: bool) -> tuple[dict[str, Any], list[str]]:
    """A checkpoint's tensors under our names, and the names not in :data:`CHECKPOINT_NAMES` (buffers that are
    recomputed left out). ``sandwich``: the family has norms after attention and the MLP (Gemma), where
    ``post_attention_layernorm`` is the norm after attention; elsewhere it is the norm before the MLP."""
    named: dict[str, Any] = {}
    unknown: list[str] = []
    for name, tensor in state.items():
        found = _lookup(_CHECKPOINT, name)
        if found is None:
            if not CHECKPOINT_IGNORED.match(name):
                unknown.append(name)
            continue
        ours = found[0]
        if ours.endswith(".post_attention_layernorm"):
            ours = ours.removesuffix("post_attention_layernorm") + ("post_attn_norm" if sandwich else "mlp_norm")
        named[ours] = tensor
    return named, unknown


def checkpoint_module(ours: str) -> str:
    """The checkpoint's module behind one of our linear layers: ``layers.3.q`` -> ``model.layers.3.self_attn.q_proj``;
    ``head`` -> ``lm_head``."""
    layer, _, part = ours.rpartition(".")
    key = f"layers.{{i}}.{part}.weight" if layer else f"{part}.weight"
    theirs = next(t for t, o in CHECKPOINT_NAMES.items() if o == key)
    return theirs.replace("{i}", layer.removeprefix("layers.")).removesuffix(".weight")


_NO_LAYOUT = Layout()


def gguf_target(name: str, architecture: str) -> tuple[str, Layout] | None:
    """Our name of the GGUF tensor ``name`` of a file of ``architecture`` and how it is stored (:class:`Layout`);
    None when :data:`GGUF_NAMES` has no entry for it."""
    found = _lookup(_GGUF, name)
    if found is None:
        return None
    ours, key = found
    return ours, GGUF_LAYOUTS[architecture].get(key, _NO_LAYOUT)


def row_order(layout: Layout, rows: int, heads: Mapping[str, int]) -> np.ndarray | None:
    """The file's row of each of our rows (``ours[r] = file[order[r]]``), or None when the rows are in order.
    ``heads``: ``{"heads": ..., "kv_heads": ...}``."""
    if layout.interleaved_by is None:
        return None
    n = heads[layout.interleaved_by]
    # file row h*D + 2j + s holds our row h*D + s*D/2 + j: read ours as [heads, 2 (s), D/2 (j)] of the file's
    # [heads, D/2 (j), 2 (s)]
    return np.arange(rows, dtype=np.int64).reshape(n, rows // n // 2, 2).swapaxes(2, 1).reshape(rows)


def undo_layout(values: np.ndarray, layout: Layout, heads: Mapping[str, int]) -> np.ndarray:
    """A tensor's float32 values (``[rows, ...]``) as the checkpoint holds them."""
    order = row_order(layout, values.shape[0], heads)
    if order is not None:
        values = values[order]
    if layout.plus_one:
        values = values - np.float32(1)
    return values
