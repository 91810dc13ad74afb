"""LoRA adapters made by ``peft`` on the tiny models, for the adapter tests, and the same models with the adapter
merged into their weights (the reference an adapter turn must equal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_hf(name: str) -> Any:
    """The transformers model of ``tiny-<name>`` (the weights turncache's ``tiny-<name>`` loads), float32."""
    from chat.models.renderer_loading import tiny_text
    from chat.models.tiny.text import build_tiny_model

    _, config = tiny_text(name)
    return build_tiny_model(config, torch.float32).eval()


def make_peft_adapter(
    where: Path, model: str = "llama", *, seed: int = 0, r: int = 4, alpha: float = 8, **options: Any
) -> tuple[Path, Any]:
    """A PEFT adapter directory written by ``peft`` for ``tiny-<model>`` (random nonzero A and B from ``seed``) and
    the model with that adapter merged into its weights (``merge_and_unload``). ``options``: more LoraConfig
    fields (``target_modules``, ``use_rslora``, ``rank_pattern``, ...)."""
    from peft import LoraConfig, get_peft_model

    options.setdefault("target_modules", ALL_TARGETS)
    config = LoraConfig(r=r, lora_alpha=alpha, init_lora_weights=False, **options)
    torch.manual_seed(seed)
    peft_model = get_peft_model(tiny_hf(model), config)
    with torch.no_grad():  # peft's own init: A kaiming, B random too; widen B so the update shows in the logits
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(4.0)
    where.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(where))
    return where, peft_model.merge_and_unload().eval()


def logits_of(model: Any, ids: list[int]) -> torch.Tensor:
    """``[len(ids), vocab]`` float32 logits of a transformers model over ``ids``."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def llama_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of q/k rows in a GGUF file (interleaved rotary halves), from the model's own order."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def write_gguf_lora(peft_dir: Path, out: Path, config: Any) -> Path:
    """The PEFT adapter in ``peft_dir`` as a llama.cpp GGUF LoRA file (what convert_lora_to_gguf.py writes for a
    llama: ``blk.{i}.<tensor>.weight.lora_a`` / ``lora_b``, q/k ``B`` rows in llama.cpp's order, the alpha)."""
    import json

    import gguf
    from safetensors.torch import load_file

    alpha = float(json.loads((peft_dir / "adapter_config.json").read_text())["lora_alpha"])
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for key, tensor in sorted(load_file(str(peft_dir / "adapter_model.safetensors")).items()):
        module = key.removeprefix("base_model.model.model.layers.")
        layer, rest = module.split(".", 1)
        theirs, which = rest.rsplit(".lora_", 1)
        target = names[theirs]
        values = tensor.float().numpy()
        if which.startswith("B") and target == "attn_q":
            values = llama_permute(values, config.num_attention_heads)
        elif which.startswith("B") and target == "attn_k":
            values = llama_permute(values, config.num_key_value_heads)
        suffix = "lora_a" if which.startswith("A") else "lora_b"
        writer.add_tensor(f"blk.{layer}.{target}.weight.{suffix}", np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


IDS = [3, 17, 25, 9, 40, 41, 7, 99, 12, 5, 60, 61, 2, 33]  # the prompt the LoRA tests compute
TOLERANCE = 1e-4  # max abs logit difference from the merged model (float32)


def loaded(runtime: Any, name: str, path: Path, scale: float = 1.0) -> Any:
    """The adapter at ``path`` read and added to ``runtime``'s bank under ``name`` (replacing one of that name)."""
    adapter = runtime.adapters.read(name, str(path), scale)
    runtime.adapters.add(adapter, replace=True)
    return adapter


def forward(runtime: Any, runs_ids: list[tuple[Any, list[int]]]) -> list[torch.Tensor]:
    """One ``forward_batch`` of every ``(run, ids)`` with all their logits; fails on a feed's error."""
    from chat.engine.runtime import Feed

    feeds = [Feed(run, ids, len(ids)) for run, ids in runs_ids]
    out = runtime.forward_batch(feeds)
    for o in out:
        assert not isinstance(o, Exception), o
    return out


def copy_adapter(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst
