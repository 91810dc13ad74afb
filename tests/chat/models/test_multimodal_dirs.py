"""Local Hugging Face directories of multimodal models load with their own processor settings; refused families say
why."""

from __future__ import annotations

import json

import pytest
import torch

from chat.models import UnsupportedArchitectureError, load_model
from chat.tools.testing.tiny_mm import build_tiny_multimodal
from tests.chat.models.mm_helpers import image, png, user


def save_tiny(name: str, path) -> None:
    model, tokenizer, family = build_tiny_multimodal(name, torch.float32)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    (path / "chat_template.jinja").write_text(tokenizer.chat_template)
    settings: dict = {}
    for preparer in family.preparers.values():
        processor = getattr(preparer, "processor", None) or getattr(preparer, "extractor", None)
        settings.update(json.loads(processor.to_json_string()))
    if name == "omni":  # one merged file with the pixel budget as min/max_pixels, as Qwen2.5-Omni ships it
        del settings["size"]
        image_proc = family.preparers["image"].processor
        settings["min_pixels"], settings["max_pixels"] = (
            image_proc.size["shortest_edge"],
            image_proc.size["longest_edge"],
        )
        video_proc = family.preparers["video"].processor
        (path / "video_preprocessor_config.json").write_text(
            json.dumps(
                {
                    "min_pixels": video_proc.size["shortest_edge"],
                    "max_pixels": video_proc.size["longest_edge"],
                    "max_frames": family.preparers["video"].options.num_frames,
                }
            )
        )
    (path / "preprocessor_config.json").write_text(json.dumps(settings))


@pytest.mark.parametrize("name", ["omni", "llava"])
def test_a_saved_directory_serves_the_same_prompts_and_logits(tmp_path, name):
    torch.set_num_threads(1)
    save_tiny(name, tmp_path)
    tiny = load_model(f"tiny-{name}")
    local = load_model(str(tmp_path))
    assert local.modalities == tiny.modalities
    for kind, preparer in tiny.family.preparers.items():
        assert local.family.preparers[kind].fingerprint == preparer.fingerprint, kind  # same processor settings
    messages = [{"role": "system", "content": "Be brief."}, user("What is ", image(png(4)), "?")]
    a, b = tiny.render_prompt(messages), local.render_prompt(messages)
    assert a.tokens == b.tokens and a.spans == b.spans
    run_a, run_b = tiny.new_run(None, a), local.new_run(None, b)
    assert torch.allclose(tiny.forward(run_a, a.tokens), local.forward(run_b, b.tokens), atol=1e-5)


def test_gemma3_multimodal_is_refused_with_its_reason(tmp_path):
    from transformers import Gemma3Config

    Gemma3Config(text_config={"num_hidden_layers": 1}, vision_config={"num_hidden_layers": 1}).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="bidirectional"):
        load_model(str(tmp_path))
