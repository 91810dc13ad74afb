"""chat.models.fingerprint: a model's cache namespace id changes with everything that changes its states, and with
nothing else."""

from __future__ import annotations

import re

import torch
from transformers import LlamaConfig

from chat.models.fingerprint import model_fingerprint, tensors_digest, weight_files_digest
from tests.chat.models.helpers import tiny


def test_weight_files_digest_reads_the_weight_files_names_and_bytes_only(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")
    first = weight_files_digest(tmp_path)
    (tmp_path / "config.json").write_text('{"other": 1}')  # no weight file: not part of it
    assert weight_files_digest(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    assert weight_files_digest(tmp_path) != first
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "model.safetensors").rename(tmp_path / "other.safetensors")
    assert weight_files_digest(tmp_path) != first  # the names count too


def test_tensors_digest_ignores_order_and_sees_dtype_shape_and_values():
    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(3)
    digest = tensors_digest([("a", a), ("b", b)])
    assert tensors_digest([("b", b), ("a", a)]) == digest
    assert tensors_digest([("a", a.double()), ("b", b)]) != digest
    assert tensors_digest([("a", a.reshape(3, 2)), ("b", b)]) != digest
    assert tensors_digest([("a", a + 1), ("b", b)]) != digest
    assert tensors_digest([("c", a), ("b", b)]) != digest


def test_the_fingerprint_names_the_format_and_changes_with_what_changes_states():
    tokenizer = tiny("tiny-llama")._tokenizer
    config = LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16, num_attention_heads=2)
    base = model_fingerprint("m", config, tokenizer, "w1")
    assert re.fullmatch(r"m@[0-9a-f]{24}", base)
    assert re.fullmatch(r"m\+int8@[0-9a-f]{24}", model_fingerprint("m", config, tokenizer, "w1", weights="int8"))
    assert model_fingerprint("m", config, tokenizer, "w2") != base
    assert model_fingerprint("m", config, tokenizer, "w1", forward="own-1") != base
    other = LlamaConfig(num_hidden_layers=2, hidden_size=8, intermediate_size=16, num_attention_heads=2)
    assert model_fingerprint("m", other, tokenizer, "w1") != base
    volatile = LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16, num_attention_heads=2)
    volatile._name_or_path = "/somewhere/else"  # where it was read from: not part of the states
    assert model_fingerprint("m", volatile, tokenizer, "w1") == base


def test_another_chat_template_is_another_fingerprint():
    tokenizer = tiny("tiny-llama")._tokenizer
    config = LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16, num_attention_heads=2)
    base = model_fingerprint("m", config, tokenizer, "w1")
    own = tokenizer.chat_template
    try:
        tokenizer.chat_template = "{{ messages[0]['content'] }}"
        assert model_fingerprint("m", config, tokenizer, "w1") != base
    finally:
        tokenizer.chat_template = own
    assert model_fingerprint("m", config, tokenizer, "w1") == base
