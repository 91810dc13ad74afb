"""chat.models.hf.families_mm: which multimodal families are served, and the family each builder makes from a config
and its tokenizer (placeholders, preparers, encoders, positions, markers), refusing configs and tokenizers that lack
what it needs. Built from the tiny models' configs and tokenizers (no weights); a saved directory's family is in
test_multimodal_dirs.py."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import transformers

from chat.models.errors import ModelLoadError, UnsupportedArchitectureError
from chat.models.hf.families_mm import (
    MODEL_CLASSES,
    QWEN_ENCODERS,
    SERVED,
    check_multimodal_config,
    is_multimodal,
    llava_family,
    pixtral_family,
    qwen3_image_rows,
    tiled_family,
)
from chat.models.tiny.media import tiny_family, tiny_multimodal_text, tiny_tokenizer


@pytest.fixture(scope="module")
def texts():
    """tokenizer and config of the tiny multimodal models this file builds families of"""
    return {
        name: tiny_multimodal_text(name) for name in ("omni", "llava", "smolvlm", "mistral3", "gemma3mm", "qwen3vl")
    }


def test_multimodal_configs_are_told_from_text_ones(texts):
    assert all(is_multimodal(config) for _, config in texts.values())
    assert not is_multimodal(transformers.LlamaConfig())


def test_every_served_family_has_its_class_and_others_are_refused(texts):
    assert set(MODEL_CLASSES) == set(SERVED)
    assert all(hasattr(transformers, name) for name in MODEL_CLASSES.values())
    for _, config in texts.values():
        check_multimodal_config(config)  # the tiny ones are served
    with pytest.raises(UnsupportedArchitectureError, match="not served") as info:
        check_multimodal_config(transformers.PaliGemmaConfig())
    assert info.value.architecture == "paligemma" and set(info.value.supported) == set(SERVED)


def test_omni_takes_three_kinds_and_marks_audio_in_video(texts):
    tokenizer, config = texts["omni"]
    family = tiny_family("omni", config, tokenizer)
    assert set(family.placeholders) == set(family.preparers) == set(family.encoders) == {"image", "video", "audio"}
    assert family.placeholders["image"] == config.image_token_id == tokenizer.convert_tokens_to_ids("<|IMAGE|>")
    assert family.mrope is not None and family.markers  # 3-D positions; a video's audio interleaved
    assert all(isinstance(token, int) for token in family.markers.values())


def test_a_config_without_a_placeholder_is_refused(texts):
    _, config = texts["llava"]
    fields = ("model_type", "vision_config", "vision_feature_select_strategy")
    bare = SimpleNamespace(**{name: getattr(config, name) for name in fields})  # no image token named
    with pytest.raises(ModelLoadError, match="no image placeholder token"):
        llava_family(bare, processor=None)


def test_llava_counts_its_patches(texts):
    _, config = texts["llava"]
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    family = tiny_family("llava", config)
    assert family.preparers["image"].tokens == patches + (config.vision_feature_select_strategy == "full")
    assert family.mrope is None and family.placeholders == {"image": config.image_token_index}


def test_tiled_and_pixtral_families_need_their_markers_as_tokens(texts):
    tokenizer, config = texts["smolvlm"]
    assert tiny_family("smolvlm", config, tokenizer).placeholders == {"image": config.image_token_id}
    plain = tiny_tokenizer([], {})  # no image markers
    with pytest.raises(ModelLoadError, match="image markers"):
        tiled_family(config, None, plain)
    tokenizer, config = texts["mistral3"]
    assert tiny_family("mistral3", config, tokenizer).placeholders == {"image": config.image_token_index}
    with pytest.raises(ModelLoadError, match=r"\[IMG_BREAK\]"):
        pixtral_family(config, None, plain)


def test_gemma3_images_are_computed_whole_and_written_as_its_processor_does(texts):
    tokenizer, config = texts["gemma3mm"]
    family = tiny_family("gemma3mm", config, tokenizer)
    assert family.bidirectional and family.preparers["image"].tokens == config.mm_tokens_per_image
    assert family.template_text == {"<start_of_image>": "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"}


def test_qwen3_vl_feeds_deepstack_rows_to_the_first_layers(texts):
    tokenizer, config = texts["qwen3vl"]
    family = tiny_family("qwen3vl", config, tokenizer)
    assert family.deepstack == len(config.vision_config.deepstack_visual_indexes) > 0
    assert family.encoders["image"] is qwen3_image_rows
    flat = copy.deepcopy(config)
    flat.vision_config.deepstack_visual_indexes = []
    plain = tiny_family("qwen3vl", flat, tokenizer)
    assert plain.deepstack == 0 and dict(plain.encoders) == QWEN_ENCODERS
