"""Plain transformers ``generate`` on the same weights, for benchmarks to compare against (no prefix cache, the
stock ``DynamicCache``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from chat.models.adapter import ModelAdapter


def hf_generate(runtime: ModelAdapter, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy ``model.generate`` from ``prompt``; returns the new token ids (ending with an EOS id if one was made).

    Stops at the adapter's EOS ids, as the engine does.
    """
    model = runtime._model  # the baseline needs the transformers model itself; it stays inside chat.models
    ids = torch.as_tensor([list(prompt)], dtype=torch.long, device=runtime.device)  # [1, n]
    eos = sorted(runtime.eos_token_ids)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos or None,
            pad_token_id=eos[0] if eos else None,
        )
    return out[0, ids.shape[1] :].tolist()
