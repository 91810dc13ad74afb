"""Tiny GGUF files for the GGUF tests, written with gguf-py as llama.cpp's converter lays them out: a seeded tiny
model's weights (tiny-llama, tiny-lfm2, a tiny Qwen3, or a wider tiny llama whose rows hold whole 256-value
super-blocks for the K-quants) under llama.cpp's tensor names (a llama's q/k rows permuted the way llama.cpp permutes
them), and the tiny tokenizer as a byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``: tokens, token types,
merges). No download: ~0.8 MB in F32, ~0.2 MB in Q8_0, written in well under a second.

gguf-py quantizes Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / F16 / BF16 but not the K-quants nor the IQ4 types:
:func:`quantize_q4_k` and :func:`quantize_q6_k` write valid blocks of those two (a plain round-to-nearest encoder
written from ggml's block layout, not llama.cpp's search for the best scales), :func:`random_blocks` random blocks of
Q5_K, Q3_K, Q2_K, IQ4_NL and IQ4_XS (their scales sized to the tensor); gguf-py then reads them all back.
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
    from chat.models.renderer_loading import tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, config = tiny_text("llama")
    return build_tiny_model(config, torch.float32)


def reference_lfm2() -> torch.nn.Module:
    """The plain transformers model of tiny-lfm2 (short convolutions + attention), float32, eval mode."""
    from chat.models.renderer_loading import tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, config = tiny_text("lfm2")
    return build_tiny_model(config, torch.float32)


def reference_qwen3() -> torch.nn.Module:
    """A tiny seeded Qwen3 (2 layers, width 64, the tiny tokenizer's vocabulary), float32, eval mode. Its head_dim
    is 128, Qwen3's default, because transformers does not read a Qwen3 GGUF's head size (real Qwen3 models all
    have 128)."""
    import transformers

    from chat.models.renderer_loading import tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, llama = tiny_text("llama")
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


def reference_wide_llama() -> torch.nn.Module:
    """A tiny seeded llama whose every matrix has rows of 256 values or more (hidden 256, MLP 512, 2 layers, head
    size 64), float32, eval mode: what K-quant files need."""
    import transformers

    from chat.models.renderer_loading import tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, llama = tiny_text("llama")
    config = transformers.LlamaConfig(
        vocab_size=llama.vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=llama.eos_token_id,
        pad_token_id=llama.pad_token_id,
        bos_token_id=None,
    )
    return build_tiny_model(config, torch.float32)


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(*values.shape, 1).view(np.uint8)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """float32 [rows, 256 n] -> Q4_K blocks [rows, 144 n]: per 32-value sub-block a 6-bit scale and min over the
    super-block's float16 d and dmin, 4-bit quants; w = d * scale * q - dmin * min."""
    rows = values.shape[0]
    x = values.reshape(rows, -1, 8, 32).astype(np.float32)
    low = np.minimum(x.min(axis=-1), 0)  # [rows, n, 8]
    step = (x.max(axis=-1) - low) / 15
    d = (step.max(axis=-1) / 63).astype(np.float16).astype(np.float32)  # [rows, n]
    dmin = ((-low).max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.where(d > 0, d, 1)[..., None]), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-low / np.where(dmin > 0, dmin, 1)[..., None]), 0, 63).astype(np.uint8)
    scale, offset = d[..., None] * sc, dmin[..., None] * mn
    q = np.clip(np.round((x + offset[..., None]) / scale[..., None]), 0, 15).astype(np.uint8)  # [rows, n, 8, 32]
    packed = np.zeros((*sc.shape[:2], 12), dtype=np.uint8)
    packed[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    q = q.reshape(rows, -1, 4, 2, 32)
    qs = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(rows, -1, 128)
    return np.concatenate([_f16(d), _f16(dmin), packed, qs], axis=-1).reshape(rows, -1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """float32 [rows, 256 n] -> Q6_K blocks [rows, 210 n]: per 16-value sub-block an int8 scale over the
    super-block's float16 d, 6-bit quants stored as 4 low bits and 2 high bits; w = d * scale * (q - 32)."""
    rows = values.shape[0]
    x = values.reshape(rows, -1, 16, 16).astype(np.float32)
    step = np.abs(x).max(axis=-1) / 31  # [rows, n, 16]
    d = (step.max(axis=-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.where(d > 0, d, 1)[..., None]), 1, 127).astype(np.int8)
    scale = d[..., None] * sc
    q = (np.clip(np.round(x / scale[..., None]), -32, 31) + 32).astype(np.uint8).reshape(rows, -1, 2, 4, 32)
    low = q & 0x0F
    ql = np.concatenate([low[..., 0, :] | (low[..., 2, :] << 4), low[..., 1, :] | (low[..., 3, :] << 4)], axis=-1)
    qh = q[..., 0, :] >> 4 | (q[..., 1, :] >> 4) << 2 | (q[..., 2, :] >> 4) << 4 | (q[..., 3, :] >> 4) << 6
    return np.concatenate(
        [ql.reshape(rows, -1, 128), qh.reshape(rows, -1, 64), sc.view(np.uint8), _f16(d)], axis=-1
    ).reshape(rows, -1)


# types gguf-py cannot quantize and no encoder is written for here: random blocks (any bit pattern is a valid block)
# with float16 scale fields sized to the tensor's largest value; (byte offset, divisor of that value) per field
RANDOM_SCALES = {
    "Q5_K": [(0, 63 * 31)],  # w = d * scale * q - dmin * min
    "Q3_K": [(108, 32 * 4)],  # w = d * (scale - 32) * q, q in -4..3
    "Q2_K": [(80, 15 * 3)],  # w = d * scale * q - dmin * min
    "IQ4_NL": [(0, 127)],  # w = d * table value
    "IQ4_XS": [(0, 32 * 127)],  # w = d * (scale - 32) * table value
}
# K-quants with mins: each sub-block's min set to its scale and dmin to d times half the largest quant, so that the
# weights are centred (w = d * scale * (q - half)) as a quantizer's would be: (dmin's offset, half)
CENTRED = {"Q5_K": (2, 15.5), "Q2_K": (82, 1.5)}


def random_blocks(values: np.ndarray, qtype: str) -> np.ndarray:
    """Random ``qtype`` blocks for ``values`` [rows, columns] (only their shape, largest magnitude and bytes count:
    the same row always gives the same blocks), scaled so that the weights stay within about that magnitude."""
    import zlib

    import gguf

    per, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rows, columns = values.shape
    raw = np.empty((rows, columns // per, size), dtype=np.uint8)
    top = float(np.abs(values).max()) or 1.0
    for i, row in enumerate(np.ascontiguousarray(values, dtype=np.float32)):  # a row's blocks from its own bytes:
        rng = np.random.default_rng(zlib.crc32(row.tobytes()))  # rows permuted (llama's q/k) give permuted blocks
        raw[i] = rng.integers(0, 256, size=(columns // per, size), dtype=np.uint8)
        for at, divisor in RANDOM_SCALES[qtype]:
            scale = rng.uniform(0.5, 1.0, size=(columns // per, 1)) * top / divisor
            raw[i, :, at : at + 2] = scale.astype(np.float16).view(np.uint8)
    if qtype in CENTRED:
        at, half = CENTRED[qtype]
        d = raw[..., 0 if qtype == "Q5_K" else 80 : 2 if qtype == "Q5_K" else 82].copy().view(np.float16)
        raw[..., at : at + 2] = (d.astype(np.float32) * half).astype(np.float16).view(np.uint8)
        if qtype == "Q2_K":  # byte: scale | min << 4
            raw[..., 0:16] = (raw[..., 0:16] & 0x0F) | ((raw[..., 0:16] & 0x0F) << 4)
        else:  # Q4_K's packing of six-bit scales and mins: equal mins repeat the scales' bits
            raw[..., 8:12] = raw[..., 4:8]
            raw[..., 12:16] = (raw[..., 12:16] & 0x0F) | ((raw[..., 12:16] & 0x0F) << 4)
    return raw.reshape(rows, -1)


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
SUPER_BLOCKS = {*K_QUANTIZERS, "Q5_K", "Q3_K", "Q2_K", "IQ4_XS"}  # types of 256-value super-blocks
MIXED = {"Q4_K_M": ("Q4_K", ("attn_v.weight", "ffn_down.weight"), "Q6_K")}  # llama.cpp's mix: some layers in Q6_K


def quantize(values: np.ndarray, qtype: str) -> tuple[np.ndarray, object]:
    """(raw blocks, gguf type) of ``values`` [rows, columns] in ``qtype``."""
    import gguf

    quant = gguf.GGMLQuantizationType[qtype]
    if qtype in RANDOM_SCALES:
        return random_blocks(values, qtype), quant
    if qtype in K_QUANTIZERS:
        return K_QUANTIZERS[qtype](values), quant
    return gguf.quants.quantize(values, quant), quant


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
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: the file has no output.weight (as SmolLM2's)
        name, values = gguf_name(hf_name, config.model_type), tensor.detach().float().numpy()
        if name.endswith("shortconv.conv.weight"):
            values = values.squeeze(1)
        if permuted and name.endswith("attn_q.weight"):
            values = to_llama_cpp_rows(values, config.num_attention_heads)
        elif permuted and name.endswith("attn_k.weight"):
            values = to_llama_cpp_rows(values, config.num_key_value_heads)
        kind = qtype
        if qtype in MIXED:
            kind = MIXED[qtype][2] if name.endswith(MIXED[qtype][1]) else MIXED[qtype][0]
        width = 256 if kind in SUPER_BLOCKS else 32
        blocks = values.ndim == 2 and values.shape[1] % width == 0  # rows of whole quantization blocks
        if blocks and kind == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        elif blocks and kind != "F32":
            raw, raw_type = quantize(values, kind)
            writer.add_tensor(name, raw, raw_dtype=raw_type)
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

    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in out.named_parameters():
            kind = qtype
            if qtype in MIXED:
                suffix = gguf_name(name, out.config.model_type) if name.startswith("model.layers.") else name
                kind = MIXED[qtype][2] if suffix.endswith(MIXED[qtype][1]) else MIXED[qtype][0]
            width = 256 if kind in SUPER_BLOCKS else 32
            if param.dim() != 2 or param.shape[1] % width:
                continue
            values = param.numpy()
            if kind == "F16":
                stored = values.astype(np.float16).astype(np.float32)
            elif kind == "Q8_0":
                stored = decode_q8_0(gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0), values.shape[1])
            else:
                raw, raw_type = quantize(values, kind)
                stored = gguf.quants.dequantize(raw, raw_type)
            param.copy_(torch.from_numpy(np.ascontiguousarray(stored)).reshape(param.shape))
    return out
