"""Tiny seeded random-weight models, one per cache kind, for tests and for trying the server without weights.

``tiny-<name>`` builds the transformers config in :data:`TINY` (a few layers of width 64), fills its weights from a
fixed seed, and pairs it with the committed tokenizer in ``assets/tiny_tokenizer``. The same name gives the same
weights on every call (same torch and transformers versions). Sliding models use a window of :data:`WINDOW` tokens so
that short tests roll it over. Weights are drawn wider than the usual init (std :data:`INIT_STD`) so that logits are
not flat and a wrongly restored state shows up in them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from chat.models.tiny.templates import HERMES_TOOLS, THINKING

WINDOW = 8  # sliding window of the tiny sliding models
INIT_STD = 0.05  # std of the weight matrices: logits spread ~0.4 (the usual 0.02 gives nearly flat logits; much
# wider weights make the chunked linear-attention kernels lose ~1e-4 of precision between chunkings)
SEED = 1234
RANDOM_BIASES = {"qwen2"}  # model types whose q/k/v biases are drawn like the weights (else they start at zero)
CONTEXT = 4096  # max_position_embeddings of every tiny model (tiny-mistral3: tiny_mm.MISTRAL3_CONTEXT)

_COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": CONTEXT,
    "tie_word_embeddings": False,
}
_MAMBA2 = {"mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_chunk_size": 16}


@dataclass(frozen=True, slots=True)
class TinySpec:
    config_class: str  # a transformers config class
    kwargs: dict[str, Any] = field(default_factory=dict)  # on top of the vocabulary and special token ids
    common: bool = True  # start from _COMMON
    chat_template: str | None = None  # instead of the tokenizer's plain ChatML (chat.models.tiny.templates)
    base: bool = False  # no chat template at all: a base model (completions only)


TINY: dict[str, TinySpec] = {
    "llama": TinySpec("LlamaConfig"),
    "base": TinySpec("LlamaConfig", base=True),  # tiny-llama's weights without a chat template: a base model
    "hermes": TinySpec("LlamaConfig", chat_template=HERMES_TOOLS),  # a template that takes tools (Qwen/Hermes style)
    "thinking": TinySpec("LlamaConfig", chat_template=THINKING),  # a template that thinks (Qwen3 style)
    "mistral": TinySpec("MistralConfig", {"sliding_window": WINDOW}),
    "qwen2": TinySpec("Qwen2Config"),  # q/k/v biases (drawn like the weights: RANDOM_BIASES)
    "qwen3": TinySpec(  # q/k norms; layers from max_window_layers on slide
        "Qwen3Config", {"head_dim": 16, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2}
    ),
    "gemma2": TinySpec(  # soft-capped attention scores and logits, small enough caps to bend the tiny model's values
        "Gemma2Config",
        {
            "sliding_window": WINDOW,
            "head_dim": 16,
            "query_pre_attn_scalar": 32,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    "gemma3": TinySpec(
        "Gemma3TextConfig",
        {"sliding_window": WINDOW, "head_dim": 16, "layer_types": ["sliding_attention", "full_attention"] * 2},
    ),
    "qwen3next": TinySpec(
        "Qwen3NextConfig",
        {
            "head_dim": 16,
            "layer_types": ["linear_attention", "full_attention"] * 2,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "lfm2": TinySpec("Lfm2Config", {"layer_types": ["conv", "full_attention"] * 2}),
    "falconh1": TinySpec("FalconH1Config", {**_MAMBA2, "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16}),
    "granitemoehybrid": TinySpec(
        "GraniteMoeHybridConfig",
        {
            **_MAMBA2,
            "layer_types": ["mamba", "attention"] * 2,
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
        },
    ),
    "zamba2": TinySpec(
        "Zamba2Config",
        {
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "layers_block_type": ["mamba", "hybrid"] * 2,
            "mamba_d_state": 16,
            "mamba_headdim": 16,
            "mamba_ngroups": 1,
            "n_mamba_heads": 8,
            "chunk_size": 16,
            "use_mem_rope": True,
            "max_position_embeddings": CONTEXT,
        },
        common=False,
    ),
}

# tiny names of refused families -> their transformers config class (refused by chat.models.families)
TINY_REFUSED = {
    "mamba": "MambaConfig",
    "falconmamba": "FalconMambaConfig",
    "jamba": "JambaConfig",
    "recurrentgemma": "RecurrentGemmaConfig",
    "mamba2": "Mamba2Config",
}


def tiny_names() -> list[str]:
    return [f"tiny-{name}" for name in TINY]


def tiny_config(name: str, vocab_size: int, special: dict[str, int | None]) -> Any:
    """The transformers config of ``tiny-<name>`` (``name`` in :data:`TINY` or :data:`TINY_REFUSED`)."""
    import transformers

    if name in TINY_REFUSED:
        return getattr(transformers, TINY_REFUSED[name])(vocab_size=vocab_size)
    spec = TINY[name]
    kwargs = {**(_COMMON if spec.common else {}), **spec.kwargs, "vocab_size": vocab_size, **special}
    return getattr(transformers, spec.config_class)(**kwargs)


def build_tiny_model(config: Any, dtype: torch.dtype) -> Any:
    """A causal LM for ``config`` with seeded weights, in eval mode. Leaves the global RNG as it was."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        generator = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            for name, param in sorted(model.named_parameters()):
                matrix = param.dim() == 2 and not name.endswith("A_log")  # projections and embeddings
                bias = config.model_type in RANDOM_BIASES and name.endswith(
                    ("q_proj.bias", "k_proj.bias", "v_proj.bias")
                )
                if matrix or bias:
                    param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
    return model.to(dtype).eval()
