"""Activation smoothing before int8 quantization (the SmoothQuant idea: Xiao et al., 2023), for Llama-shaped decoders.

int8 products quantize each token's activations with one scale per token, so a few input channels with large
values (outliers) take most of the 8 bits and the other channels lose precision. Per input channel ``j`` of a linear
layer, dividing the activation by ``s[j]`` and multiplying the weight's column ``j`` by ``s[j]`` computes the same
product in exact arithmetic, and with

    s[j] = max|X[:, j]| ** alpha / max|W[:, j]| ** (1 - alpha)

the outliers move partly into the weights, which are quantized per output channel and take them better. The
division is folded into whatever produces the activation, so nothing is added at run time:

    input_layernorm.weight  /= s   ->  q_proj, k_proj, v_proj columns *= s
    post_attention_layernorm /= s  ->  gate_proj, up_proj columns *= s
    up_proj rows             /= s  ->  down_proj columns *= s        (down's input is act(gate) * up)
    final norm weight        /= s  ->  lm_head columns *= s          (a tied head is untied first)

``max|X|`` comes from one forward of the float32 model over a fixed calibration text (:data:`CALIBRATION_TEXT`).
Measured on the built-in model with ``turncache bench weights`` (docs/benchmarks.md), ``alpha = 0.5``: int8
next-token agreement with float32 0.879 without smoothing, 0.915 with it; perplexity +4.9% without, +3.1% with.

Only decoder layers whose norms scale by their weight (:data:`NORMS`) and whose MLP is ``down(act(gate) * up)`` are
smoothed; other layers are quantized as they are. Call :func:`smooth` on the float32 model before its linear layers
are converted.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ALPHA = 0.5  # how much of the outliers moves into the weights
NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen2_5OmniRMSNorm")  # out = weight * x
CALIBRATION_TEXT = (
    "The committee met on a rainy Tuesday to discuss the budget for the new library wing, and after two hours of "
    "debate they agreed to delay the decision until spring. Photosynthesis turns light, water and carbon dioxide "
    "into sugar and oxygen; most of it happens in the leaves.\n"
    "User: can you help me plan a trip to the mountains?\n"
    "Assistant: Of course. How many days do you have, and do you prefer hiking or relaxing by a lake?\n"
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'is even')\n"
)


def smooth(model: nn.Module, token_ids: list[int], alpha: float = ALPHA) -> int:
    """Fold smoothing factors into ``model`` (float32, as loaded) from one forward over ``token_ids``; return how many
    linear inputs were smoothed (0 when the model's layers do not have the expected shape)."""
    pairs = _smoothable(model)
    if not pairs:
        return 0
    peaks: dict[int, torch.Tensor] = {}

    def record(key: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0)
            peaks[key] = torch.maximum(peaks[key], x) if key in peaks else x

        return hook

    hooks = [linears[0].register_forward_hook(record(i)) for i, (_, linears) in enumerate(pairs)]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([token_ids], device=next(model.parameters()).device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad():
        for i, (source, linears) in enumerate(pairs):
            if i not in peaks:
                continue
            weight_peak = torch.stack([m.weight.abs().amax(dim=0) for m in linears]).amax(dim=0).clamp_min(1e-5)
            s = (peaks[i].float().clamp_min(1e-5) ** alpha / weight_peak ** (1 - alpha)).clamp_min(1e-5)
            source(s)
            for m in linears:
                m.weight.data = m.weight.data * s  # a new tensor: a tied head does not change the embedding
    return len(peaks)


def _smoothable(model: nn.Module) -> list[tuple[Any, list[nn.Linear]]]:
    """(divide-by-s function, linear layers whose columns take s) for every smoothable linear input."""
    pairs: list[tuple[Any, list[nn.Linear]]] = []
    for layer in model.modules():
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        norm1, norm2 = getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)
        if attn is None or mlp is None or not _scales(norm1) or not _scales(norm2):
            continue
        qkv = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
        gate, up, down = (getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
        if not all(type(m) is nn.Linear for m in (*qkv, gate, up, down)) or not hasattr(mlp, "act_fn"):
            continue
        pairs.append((_divide_weight(norm1), qkv))
        pairs.append((_divide_weight(norm2), [gate, up]))
        pairs.append((_divide_rows(up), [down]))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    final = _final_norm(model)
    if pairs and type(head) is nn.Linear and _scales(final):
        if any(head.weight is p for p in model.get_input_embeddings().parameters()):
            head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)  # untie before scaling
        pairs.append((_divide_weight(final), [head]))
    return pairs


def _scales(norm: Any) -> bool:
    return norm is not None and type(norm).__name__ in NORMS and isinstance(getattr(norm, "weight", None), torch.Tensor)


def _divide_weight(norm: nn.Module):
    def divide(s: torch.Tensor) -> None:
        norm.weight.data = norm.weight.data / s

    return divide


def _divide_rows(linear: nn.Linear):
    def divide(s: torch.Tensor) -> None:
        linear.weight.data = linear.weight.data / s.unsqueeze(1)
        if linear.bias is not None:
            linear.bias.data = linear.bias.data / s

    return divide


def _final_norm(model: nn.Module) -> nn.Module | None:
    """The norm right before the LM head: ``model.model.norm`` (causal LMs) or ``language_model.norm`` (stacks)."""
    for path in ("model.norm", "language_model.norm", "model.language_model.norm"):
        node: Any = model
        for part in path.split("."):
            node = getattr(node, part, None)
        if isinstance(node, nn.Module):
            return node
    return None


def smooth_decoder(
    draft: Any,
    weights: dict[str, Any],
    token_ids: list[int],
    alpha: float = ALPHA,
    factors: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The weights of a :class:`chat.models.decoder.model.Decoder` (our names, float32) with smoothing factors folded in
    (the same rule as :func:`smooth`), from one forward of ``draft`` (a float32 decoder over those weights) over
    ``token_ids``. New tensors throughout: the given ones (a tied head's embedding among them) are left as they were.
    For families whose norms scale by their weight (not Gemma's ``1 + weight``). ``factors``, when given, receives
    each matrix's ``s`` (``layers.{i}.qkv``, ``.gate_up``, ``.down``, ``head``: its input was divided by it), which
    a LoRA adapter's products on the same inputs need (:mod:`chat.models.decoder.lora`)."""
    from chat.models import attention
    from chat.models.kv_rows import AttentionRows

    peaks: dict[str, torch.Tensor] = {}

    def watch(name: str, call: Any) -> Any:
        def record(x: torch.Tensor) -> Any:
            seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0)
            peaks[name] = torch.maximum(peaks[name], seen) if name in peaks else seen
            return call(x)

        return record

    for i, block in enumerate(draft.layers):
        block.qkv, block.gate_up = watch(f"layers.{i}.qkv", block.qkv), watch(f"layers.{i}.gate_up", block.gate_up)
        block.down = watch(f"layers.{i}.down", block.down)
    draft.head = watch("head", draft.head)
    device = weights["embed"].device
    rows = [AttentionRows(window, (window or 1) - 1, len(token_ids)) for window in draft.args.windows]
    step = attention.step_batch([(token_ids, 0, rows, len(token_ids))], device)  # the head sees every token
    with torch.inference_mode():
        draft(input_ids=step.tokens, step=step, kernel="torch")
    out = dict(weights)

    def factor(name: str, weight: torch.Tensor) -> torch.Tensor:
        weight_peak = weight.abs().amax(dim=0).clamp_min(1e-5)
        s = (peaks[name].float().clamp_min(1e-5) ** alpha / weight_peak ** (1 - alpha)).clamp_min(1e-5)
        if factors is not None:
            factors[name] = s
        return s

    with torch.no_grad():
        for i in range(draft.args.layers):
            at = f"layers.{i}."
            s = factor(at + "qkv", weights[at + "qkv.weight"])
            out[at + "attn_norm"] = weights[at + "attn_norm"] / s
            out[at + "qkv.weight"] = weights[at + "qkv.weight"] * s
            s = factor(at + "gate_up", weights[at + "gate_up.weight"])
            out[at + "mlp_norm"] = weights[at + "mlp_norm"] / s
            gate_up = weights[at + "gate_up.weight"] * s
            s = factor(at + "down", weights[at + "down.weight"])
            width = draft.args.intermediate
            gate_up[width:] /= s.unsqueeze(1)  # up's rows: down's input is act(gate) * up
            out[at + "gate_up.weight"] = gate_up
            if weights.get(at + "gate_up.bias") is not None:
                bias = weights[at + "gate_up.bias"].clone()
                bias[width:] /= s
                out[at + "gate_up.bias"] = bias
            out[at + "down.weight"] = weights[at + "down.weight"] * s
        s = factor("head", weights["head.weight"])
        out["norm"] = weights["norm"] / s
        out["head.weight"] = weights["head.weight"] * s  # a tied head: a new tensor, the embedding stays
    return out
