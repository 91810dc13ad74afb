"""chat.models.smoothing: folding SmoothQuant factors into a float32 model changes its weights and not what it
computes (the division and the multiplication cancel in exact arithmetic), and leaves a model of another shape as
it is."""

from __future__ import annotations

import torch

from chat.models.renderer_loading import tiny_text
from chat.models.smoothing import CALIBRATION_TEXT, smooth
from chat.models.tiny.text import build_tiny_model

torch.set_num_threads(1)


def tiny_llama():
    tokenizer, config = tiny_text("llama")
    return tokenizer, build_tiny_model(config, torch.float32).eval()


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits


def test_smoothing_moves_the_outliers_into_the_weights_and_keeps_the_logits():
    tokenizer, model = tiny_llama()
    layers = model.config.num_hidden_layers
    ids = tokenizer.encode("The cat sat on the mat, and then it slept.", add_special_tokens=False)
    before = logits(model, ids)
    q_before = model.model.layers[0].self_attn.q_proj.weight.clone()
    norm_before = model.model.layers[0].input_layernorm.weight.clone()
    smoothed = smooth(model, tokenizer.encode(CALIBRATION_TEXT, add_special_tokens=False))
    assert smoothed == 3 * layers + 1  # q/k/v, gate/up and down per layer, and the LM head
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, q_before)
    assert not torch.equal(model.model.layers[0].input_layernorm.weight, norm_before)
    torch.testing.assert_close(logits(model, ids), before, rtol=1e-4, atol=1e-4)


def test_a_model_without_the_expected_norms_is_left_as_it_is():
    tokenizer, model = tiny_llama()
    for layer in model.model.layers:  # a norm that does not scale by its weight cannot take the division
        layer.input_layernorm.__class__ = type("OtherNorm", (layer.input_layernorm.__class__,), {})
        layer.post_attention_layernorm.__class__ = layer.input_layernorm.__class__
    model.model.norm.__class__ = model.model.layers[0].input_layernorm.__class__
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert smooth(model, tokenizer.encode(CALIBRATION_TEXT, add_special_tokens=False)) == 0
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
