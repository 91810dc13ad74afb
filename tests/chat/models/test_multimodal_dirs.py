"""Local Hugging Face directories of multimodal models load with their own processor settings; refused families say
why."""

from __future__ import annotations

import pytest
import torch

from chat.models import UnsupportedArchitectureError, load_model
from tests.chat.models.mm_helpers import image, mp4, png, save_tiny, user, video


@pytest.mark.parametrize(
    "name", ["omni", "llava", "smolvlm", "qwen35vl", "mistral3", "gemma3mm", "qwen3vl", "qwen3vlmoe"]
)
def test_a_saved_directory_serves_the_same_prompts_and_logits(tmp_path, name):
    torch.set_num_threads(1)
    save_tiny(name, tmp_path)
    tiny = load_model(f"tiny-{name}")
    local = load_model(str(tmp_path))
    assert local.modalities == tiny.modalities
    for kind, preparer in tiny.family.preparers.items():
        assert local.family.preparers[kind].fingerprint == preparer.fingerprint, kind  # same processor settings
    parts = [image(png(4))] + ([video(mp4())] if "video" in tiny.modalities else [])
    messages = [{"role": "system", "content": "Be brief."}, user("What is ", *parts, "?")]
    a, b = tiny.render_prompt(messages), local.render_prompt(messages)
    assert a.tokens == b.tokens and a.spans == b.spans
    run_a, run_b = tiny.new_run(None, a), local.new_run(None, b)
    assert torch.allclose(tiny.forward(run_a, a.tokens), local.forward(run_b, b.tokens), atol=1e-5)


def test_a_multimodal_family_that_is_not_served_is_refused_with_its_reason(tmp_path):
    from transformers import PaliGemmaConfig

    PaliGemmaConfig(text_config={"num_hidden_layers": 1}, vision_config={"num_hidden_layers": 1}).save_pretrained(
        tmp_path
    )
    with pytest.raises(UnsupportedArchitectureError, match="not served") as refused:
        load_model(str(tmp_path))
    assert "gemma3" in str(refused.value)  # the served families are listed
