"""chat.models.vocabulary: the sampling defaults a model's generation_config sets, and a token's bytes."""

from __future__ import annotations

from transformers import GenerationConfig

from chat.models.vocabulary import GENERATION_FIELDS, Vocabulary, generation_defaults
from tests.chat.models.helpers import tiny


def test_generation_defaults_take_the_values_a_config_sets_and_nothing_else():
    config = GenerationConfig(temperature=0.6, top_p=0.9, top_k=20, do_sample=False, max_new_tokens=7)
    assert generation_defaults(config) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert generation_defaults(None) == {}
    assert generation_defaults(GenerationConfig()) == {}  # transformers' own defaults are not the model's
    assert set(generation_defaults(config)) <= set(GENERATION_FIELDS)


def test_token_bytes_are_the_tokens_text_and_a_placeholder_past_the_tokenizer():
    model = tiny("tiny-llama")
    vocabulary = Vocabulary(model._tokenizer, logits_width=model.vocab_size + 8, eos_token_ids=model.eos_token_ids)
    (hello,) = model.encode("hello")[:1]
    assert vocabulary.token_bytes(hello) == model._tokenizer.decode([hello]).encode()
    assert vocabulary.token_bytes(next(iter(model.eos_token_ids))) == b"<|im_end|>"  # a special token: its text
    past = model.vocab_size + 4
    assert vocabulary.token_bytes(past) == f"<[{past}]>".encode()  # llguidance's name for an id it has no token of
    assert vocabulary.table() is vocabulary.table()  # built once
