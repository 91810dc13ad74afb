"""LoRA adapters made with peft for a model's transformers config (random weights, as ``bench lora`` serves them):
the stock model the adapters wrap is built here, the one place outside chat.models that imports transformers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def make_peft_adapters(
    config: Any, where: Path, ranks: Sequence[int], target_modules: Sequence[str], b_scale: float, seed: int = 0
) -> list[Path]:
    """One PEFT adapter directory per rank (``where/adapter-{i}``), ``lora_alpha = 2 * r``, random ``A`` and ``B``
    (peft's ``init_lora_weights=False``), ``B`` multiplied by ``b_scale``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = []
    for i, rank in enumerate(ranks):
        lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), init_lora_weights=False)
        model = get_peft_model(base, lora, adapter_name="default")
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.mul_(b_scale)
        path = where / f"adapter-{i}"
        model.save_pretrained(str(path))
        base = model.unload()  # the base model without this adapter's layers, for the next one
        out.append(path)
    return out
