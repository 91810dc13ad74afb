"""chat.models.tiny.text: the tiny text models' configs, their seeded weights, and one tiny model per served family."""

from __future__ import annotations

import pytest
import torch

from chat.models.tiny.text import (
    INIT_STD,
    TINY,
    TINY_REFUSED,
    WINDOW,
    build_tiny_model,
    tiny_config,
    tiny_names,
)
from tests.chat.models.helpers import ALL_TINY, tiny

SPECIAL = {"bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0}


def test_fingerprints_differ_between_models_and_are_stable():
    prints = {spec: tiny(spec).fingerprint for spec in ALL_TINY}
    assert len(set(prints.values())) == len(ALL_TINY)
    assert all(p.startswith(spec + "@") for spec, p in prints.items())
    from chat.models import load_model

    assert load_model("tiny-llama").fingerprint == prints["tiny-llama"]  # same seed, same weights


def test_every_supported_family_has_its_tiny_model():
    from chat.models.families import SUPPORTED

    families = [  # not the template variants (nor tiny-base: tiny-llama without one)
        f"tiny-{name}" for name, spec in TINY.items() if spec.chat_template is None and not spec.base
    ]
    assert sorted(name for name, _ in SUPPORTED.values()) == sorted(families)
    assert set(families) < set(tiny_names())
    for model_type, (name, _) in SUPPORTED.items():
        assert tiny(name)._model.config.model_type == model_type  # the config the forward was built from


def test_configs_are_small_and_slide_within_the_window():
    for name in TINY:
        config = tiny_config(name, 384, SPECIAL)
        assert config.vocab_size == 384 and config.hidden_size == 64 and config.num_hidden_layers == 4, name
        assert config.eos_token_id == 2, name
        if getattr(config, "sliding_window", None) is not None:
            assert config.sliding_window == WINDOW, name


def test_refused_names_give_their_refused_config_class():
    import transformers

    for name, config_class in TINY_REFUSED.items():
        assert type(tiny_config(name, 384, SPECIAL)) is getattr(transformers, config_class)


@pytest.fixture(scope="module")
def qwen2():
    return build_tiny_model(tiny_config("qwen2", 384, SPECIAL), torch.float32)


def test_the_same_config_gives_the_same_weights_and_leaves_the_rng_alone(qwen2):
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    again = build_tiny_model(tiny_config("qwen2", 384, SPECIAL), torch.float32)
    assert torch.equal(torch.rand(4), expected)
    first, second = dict(qwen2.named_parameters()), dict(again.named_parameters())
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not again.training


def test_matrices_and_qwen2_biases_are_drawn_wide(qwen2):
    params = dict(qwen2.named_parameters())
    for name, param in params.items():
        if param.dim() == 2:
            assert param.std().item() == pytest.approx(INIT_STD, rel=0.1), name
    biases = [p for n, p in params.items() if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))]
    assert biases and all(p.std().item() == pytest.approx(INIT_STD, rel=0.3) for p in biases)
    norms = [p for n, p in params.items() if n.endswith("norm.weight")]
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms)  # left at their init


def test_other_families_keep_zero_biases_and_the_dtype_is_applied():
    model = build_tiny_model(tiny_config("qwen2", 384, SPECIAL), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    from chat.models.tiny import text

    llama_like = tiny_config("qwen2", 384, SPECIAL)
    llama_like.model_type = "not-qwen2"  # the same layers, not in RANDOM_BIASES
    assert "not-qwen2" not in text.RANDOM_BIASES
    plain = build_tiny_model(llama_like, torch.float32)
    assert all(not p.any() for n, p in plain.named_parameters() if n.endswith("_proj.bias"))
