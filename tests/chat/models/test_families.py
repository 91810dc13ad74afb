"""chat.models.families: which families are served and which are refused, decided from the config alone."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, MambaConfig, Qwen2Config

from chat.models.errors import UnsupportedArchitectureError
from chat.models.families import LAYER_KINDS, REFUSED, SUPPORTED, check_config, supported_families

SMALL = {"num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2}


def test_a_served_family_gives_its_layer_types():
    assert check_config(LlamaConfig(**SMALL)) == ["full_attention", "full_attention"]
    assert all(kind in LAYER_KINDS for kind in check_config(Qwen2Config(**SMALL)))
    assert supported_families() == sorted(SUPPORTED)


def test_a_refused_family_is_refused_with_its_reason_and_the_served_ones():
    with pytest.raises(UnsupportedArchitectureError) as caught:
        check_config(MambaConfig(num_hidden_layers=1, hidden_size=8))
    assert caught.value.architecture == "mamba"
    assert caught.value.reason == REFUSED["mamba"]
    assert "llama" in caught.value.supported


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"is_encoder_decoder": True}, "encoder-decoder"),
        ({"vision_config": {}}, "multimodal"),
        ({"rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2]}}, "mRoPE"),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "cache layout is unknown"),
    ],
)
def test_what_the_adapter_cannot_store_is_refused(change, reason):
    config = LlamaConfig(**SMALL)
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(UnsupportedArchitectureError, match=reason):
        check_config(config)
