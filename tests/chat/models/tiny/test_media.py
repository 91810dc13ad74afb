"""chat.models.tiny.media: the tiny multimodal models' tokenizers, chat template, configs and seeded weights."""

from __future__ import annotations

import pytest
import torch

from chat.models.tiny.media import (
    LLAVA_PARTS,
    LLAVA_TOKENS,
    MODEL_CLASSES,
    OMNI_PARTS,
    OMNI_TOKENS,
    TINY_MM,
    build_tiny_multimodal,
    chat_template,
    tiny_family,
    tiny_multimodal_text,
    tiny_tokenizer,
)
from chat.models.tiny.tokenizer import VOCAB_SIZE


def test_added_tokens_get_fixed_ids_in_their_order():
    tokenizer = tiny_tokenizer(OMNI_TOKENS, OMNI_PARTS)
    assert tokenizer.convert_tokens_to_ids(OMNI_TOKENS) == list(range(VOCAB_SIZE, VOCAB_SIZE + len(OMNI_TOKENS)))
    assert tokenizer.encode("<|IMAGE|>", add_special_tokens=False) == [VOCAB_SIZE + 2]  # one token, not bytes


def test_the_template_renders_strings_and_parts():
    tokenizer = tiny_tokenizer(OMNI_TOKENS, OMNI_PARTS)
    assert tokenizer.chat_template == chat_template(OMNI_PARTS)
    parts = [{"type": "text", "text": "see "}, {"type": "image"}, {"type": "audio"}, {"type": "video"}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nsee "
        + OMNI_PARTS["image"]
        + OMNI_PARTS["audio"]
        + OMNI_PARTS["video"]
        + "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_part_with_a_newline_renders_it():
    text = tiny_tokenizer(LLAVA_TOKENS, LLAVA_PARTS).apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}], tokenize=False
    )
    assert text == "<|im_start|>user\n<image>\nwhat?<|im_end|>\n"


@pytest.mark.parametrize("name", TINY_MM)
def test_every_tiny_multimodal_model_has_a_config_of_its_class(name):
    import transformers

    tokenizer, config = tiny_multimodal_text(name)
    model_class = getattr(transformers, MODEL_CLASSES[name])
    assert isinstance(config, model_class.config_class)
    assert len(tokenizer) > VOCAB_SIZE  # its placeholder tokens were added


def test_unknown_names_are_key_errors():
    with pytest.raises(KeyError):
        tiny_multimodal_text("nope")
    with pytest.raises(KeyError):
        tiny_family("nope", None)


def test_the_same_name_gives_the_same_weights_and_leaves_the_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    model, tokenizer, family = build_tiny_multimodal("llava", torch.float32)
    assert torch.equal(torch.rand(3), expected)  # the global RNG is where it was
    again, _, _ = build_tiny_multimodal("llava", torch.float32)
    first, second = dict(model.named_parameters()), dict(again.named_parameters())
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    matrices = [p for p in first.values() if p.dim() >= 2]
    assert all(p.std().item() == pytest.approx(0.05, rel=0.2) for p in matrices if p.numel() >= 1024)
    assert not model.training
    assert family is not None and len(tokenizer) == VOCAB_SIZE + len(LLAVA_TOKENS)
