"""chat/tools/testing/peft_adapters.py: LoRA adapters made with peft for a model's config, one directory per rank,
``lora_alpha`` twice the rank, random ``A`` and ``B`` with ``B`` scaled (what ``bench lora`` serves)."""

import json

import pytest
import torch

pytest.importorskip("peft")

from safetensors.torch import load_file

from chat.tools.testing.baselines import load_stock
from chat.tools.testing.peft_adapters import make_peft_adapters

TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def config():
    return load_stock("tiny-llama").model.config


def _b_weights(path) -> list[torch.Tensor]:
    tensors = load_file(str(path / "adapter_model.safetensors"))
    return [t for name, t in tensors.items() if "lora_B" in name]


def test_one_adapter_per_rank_with_alpha_twice_the_rank_on_the_modules_asked(config, tmp_path):
    paths = make_peft_adapters(config, tmp_path, ranks=(2, 4), target_modules=TARGETS, b_scale=0.5)
    assert paths == [tmp_path / "adapter-0", tmp_path / "adapter-1"]
    for path, rank in zip(paths, (2, 4), strict=True):
        settings = json.loads((path / "adapter_config.json").read_text())
        assert (settings["r"], settings["lora_alpha"]) == (rank, 2 * rank)
        assert sorted(settings["target_modules"]) == TARGETS
        tensors = load_file(str(path / "adapter_model.safetensors"))
        assert {t.shape[0] for name, t in tensors.items() if "lora_A" in name} == {rank}
        assert all(t.abs().sum() > 0 for t in _b_weights(path))  # random B, not peft's zeros: the adapter acts


def test_b_is_scaled_and_the_seed_makes_the_same_adapters(config, tmp_path):
    (one,) = make_peft_adapters(config, tmp_path / "a", ranks=(2,), target_modules=TARGETS, b_scale=1.0, seed=3)
    (half,) = make_peft_adapters(config, tmp_path / "b", ranks=(2,), target_modules=TARGETS, b_scale=0.5, seed=3)
    for full, scaled in zip(_b_weights(one), _b_weights(half), strict=True):
        assert torch.allclose(scaled, 0.5 * full)
