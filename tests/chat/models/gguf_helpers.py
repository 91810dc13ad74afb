"""Tiny GGUF files for the GGUF tests, written with gguf-py as llama.cpp's converter lays them out: a seeded tiny
model's weights (tiny-llama, tiny-lfm2, or a tiny Qwen3) under llama.cpp's tensor names (a llama's q/k rows permuted
the way llama.cpp permutes them), and the tiny tokenizer as a byte-level BPE vocabulary (``tokenizer.ggml.model =
"gpt2"``: tokens, token types, merges). No download: ~0.8 MB in F32, ~0.2 MB in Q8_0, written in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from chat.models.tiny.tokenizer import ASSET_DIR, CHAT_TEMPLATE

NORMAL, CONTROL = 1, 3  # llama.cpp token types
# transformers name inside a decoder layer -> llama.cpp's leaf name
LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",  # Qwen3
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
PERMUTED = {"llama", "mistral"}  # model types whose q/k rows llama.cpp interleaves for its rope
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
TOP_NAMES["lm_head.weight"] = "output.weight"
# LFM2 (read by transformers' newer GGUF loader): its own names, the final norm named after the embedding
LFM2_LAYER_NAMES = {
    "conv.conv.weight": "shortconv.conv.weight",  # [channels, 1, L] in transformers, [channels, L] in the file
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
}
LFM2_TOP_NAMES = {**TOP_NAMES, "model.embedding_norm.weight": "token_embd_norm.weight"}


def reference_llama() -> torch.nn.Module:
    """The plain transformers model of tiny-llama (seeded weights, no turncache patches), float32, eval mode."""
    from chat.models.registry import _tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, config = _tiny_text("llama")
    return build_tiny_model(config, torch.float32)


def reference_lfm2() -> torch.nn.Module:
    """The plain transformers model of tiny-lfm2 (short convolutions + attention), float32, eval mode."""
    from chat.models.registry import _tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, config = _tiny_text("lfm2")
    return build_tiny_model(config, torch.float32)


def reference_qwen3() -> torch.nn.Module:
    """A tiny seeded Qwen3 (2 layers, width 64, the tiny tokenizer's vocabulary), float32, eval mode. Its head_dim
    is 128, Qwen3's default, because transformers does not read a Qwen3 GGUF's head size (real Qwen3 models all
    have 128)."""
    import transformers

    from chat.models.registry import _tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, llama = _tiny_text("llama")
    config = transformers.Qwen3Config(
        vocab_size=llama.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=llama.eos_token_id,
        pad_token_id=llama.pad_token_id,
        bos_token_id=None,
    )
    return build_tiny_model(config, torch.float32)


def gguf_name(hf_name: str, model_type: str = "llama") -> str:
    top, layers = (LFM2_TOP_NAMES, LFM2_LAYER_NAMES) if model_type == "lfm2" else (TOP_NAMES, LAYER_NAMES)
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<rest>
    return f"blk.{layer}.{layers[rest]}"


def to_llama_cpp_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores each head's q/k rows with the two rotary halves interleaved (GGML's rope pairs adjacent
    values; transformers' rotates halves): row (h, i, j) of the [heads, 2, half] layout moves to (h, j, i)."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, -1).transpose(0, 2, 1, 3).reshape(weight.shape)


def tokenizer_fields() -> tuple[list[str], list[int], list[str]]:
    """The tiny tokenizer as llama.cpp lists it: tokens by id, their types, and the merges."""
    spec = json.loads((ASSET_DIR / "tokenizer.json").read_text())
    tokens = [""] * len(spec["model"]["vocab"])
    for token, index in spec["model"]["vocab"].items():
        tokens[index] = token
    special = {added["id"] for added in spec["added_tokens"]}
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
    types = [CONTROL if index in special else NORMAL for index in range(len(tokens))]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in spec["model"]["merges"]]
    return tokens, types, merges


def write_tiny_gguf(
    path: Path,
    model: torch.nn.Module,
    *,
    qtype: str = "F32",
    architecture: str | None = None,
    chat_template: str | None = CHAT_TEMPLATE,
    extra_tensors: dict[str, np.ndarray] | None = None,
    metadata: dict[str, int] | None = None,
    weights: bool = True,
) -> Path:
    """Write ``model`` (a tiny llama, Qwen3 or LFM2) as a GGUF file: 2-D weights whose rows are whole blocks in
    ``qtype`` (a gguf.GGMLQuantizationType name), the rest in F32; metadata under ``architecture``'s keys (by
    default the model's own) plus ``metadata`` (as uint16); the tiny tokenizer, and ``chat_template`` (None: none).
    ``weights=False`` leaves the tensors out (a vocabulary-only file)."""
    import gguf

    config = model.config
    quant = gguf.GGMLQuantizationType[qtype]
    permuted = config.model_type in PERMUTED
    writer = gguf.GGUFWriter(str(path), architecture or config.model_type)
    writer.add_name(f"tiny {config.model_type}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    if config.model_type == "lfm2":
        writer.add_feed_forward_length(model.model.layers[0].feed_forward.w1.out_features)  # after auto-adjust
        writer.add_head_count_kv([config.num_key_value_heads if t != "conv" else 0 for t in config.layer_types])
        writer.add_layer_norm_rms_eps(config.norm_eps)
        writer.add_shortconv_l_cache(config.conv_L_cache)
    else:
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    tokens, types, merges = tokenizer_fields()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in (metadata or {}).items():
        writer.add_uint16(key, value)
    for hf_name, tensor in model.state_dict().items() if weights else ():
        name, values = gguf_name(hf_name, config.model_type), tensor.detach().float().numpy()
        if name.endswith("shortconv.conv.weight"):
            values = values.squeeze(1)
        if permuted and name.endswith("attn_q.weight"):
            values = to_llama_cpp_rows(values, config.num_attention_heads)
        elif permuted and name.endswith("attn_k.weight"):
            values = to_llama_cpp_rows(values, config.num_key_value_heads)
        blocks = values.ndim == 2 and values.shape[1] % 32 == 0  # rows of whole quantization blocks
        if blocks and quant == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        elif blocks and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quants.quantize(values, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, np.ascontiguousarray(values))
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def decode_q8_0(raw: np.ndarray, columns: int) -> np.ndarray:
    """Q8_0 bytes -> float32, written from ggml's block layout rather than taken from gguf-py: each block of 32
    values is a float16 scale ``d`` then 32 int8 ``q``; value = d * q. ``raw``: [rows, columns / 32 * 34] uint8."""
    blocks = raw.reshape(-1, 34)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    quants = blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # [blocks, 32]
    return (scale * quants).reshape(-1, columns)


def dequantized_copy(model: torch.nn.Module, qtype: str) -> torch.nn.Module:
    """``model`` with every 2-D weight replaced by what ``qtype`` stores of it: quantized by gguf-py, then decoded
    by :func:`decode_q8_0` (Q8_0) or gguf-py (the other types)."""
    import copy

    import gguf

    quant = gguf.GGMLQuantizationType[qtype]
    out = copy.deepcopy(model)
    with torch.no_grad():
        for _, param in out.named_parameters():
            if param.dim() != 2 or param.shape[1] % 32:
                continue
            values = param.numpy()
            if quant == gguf.GGMLQuantizationType.F16:
                stored = values.astype(np.float16).astype(np.float32)
            elif quant == gguf.GGMLQuantizationType.Q8_0:
                stored = decode_q8_0(gguf.quants.quantize(values, quant), values.shape[1])
            else:
                stored = gguf.quants.dequantize(gguf.quants.quantize(values, quant), quant)
            param.copy_(torch.from_numpy(np.ascontiguousarray(stored)).reshape(param.shape))
    return out
