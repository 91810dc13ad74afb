"""Plain transformers ``generate`` on the same weights, for benchmarks to compare against (no prefix cache, the
stock ``DynamicCache``, the model as loaded: the adapter's fast paths are undone while it runs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from chat.models.adapter import ModelAdapter


def hf_generate(runtime: ModelAdapter, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy ``model.generate`` from ``prompt``; returns the new token ids (ending with an EOS id if one was made).

    Stops at the adapter's EOS ids, as the engine does. Runs on the stock model (row-major weights, SDPA attention;
    see :meth:`ModelAdapter.stock_model`).
    """
    ids = torch.as_tensor([list(prompt)], dtype=torch.long, device=runtime.device)  # [1, n]
    eos = sorted(runtime.eos_token_ids)
    with runtime.stock_model() as model, torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos or None,
            pad_token_id=eos[0] if eos else None,
        )
    return out[0, ids.shape[1] :].tolist()
