"""Everything the adapter refuses, it refuses with a typed error that says what is accepted."""

from __future__ import annotations

import json

import pytest

from chat.engine.errors import NoChatTemplateError
from chat.models import (
    InvalidSettingError,
    ModelError,
    ModelLoadError,
    UnknownModelError,
    UnsupportedArchitectureError,
    load_model,
)
from chat.tools.testing.baselines import save_stock
from tests.chat.models.helpers import tiny


@pytest.mark.parametrize("spec", ["gpt-17", "tiny-nope", "", "/no/such/dir"])
def test_unknown_specs_name_the_choices(spec):
    with pytest.raises(UnknownModelError) as info:
        load_model(spec)
    message = str(info.value)
    assert "smollm2" in message and "tiny-llama" in message and "tiny-qwen3next" in message
    assert isinstance(info.value, ModelError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("spec", "family"),
    [
        ("tiny-mamba", "mamba"),
        ("tiny-falconmamba", "falcon_mamba"),
        ("tiny-jamba", "jamba"),
        ("tiny-recurrentgemma", "recurrent_gemma"),
        ("tiny-mamba2", "mamba2"),
    ],
)
def test_refused_families_say_why_and_what_is_supported(spec, family):
    with pytest.raises(UnsupportedArchitectureError) as info:
        load_model(spec)
    assert info.value.architecture == family
    assert "llama" in info.value.supported and "qwen3_next" in info.value.supported
    assert family in str(info.value) and "Supported families" in str(info.value)


def test_a_refused_directory_is_refused_before_weights_are_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "vocab_size": 100}))
    with pytest.raises(UnsupportedArchitectureError, match="Mamba-1"):
        load_model(str(tmp_path))


def test_a_directory_without_a_config_or_chat_template(tmp_path):
    """No config.json: refused. No chat template (tokenizer_config.json, chat_template.jinja): a base model, which
    loads and refuses to render chat, never guessing a template."""
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(str(tmp_path))
    save_stock("tiny-llama", tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    base = load_model(str(tmp_path))
    assert base.chats is False and base.encode("one two") == tiny("tiny-llama").encode("one two")
    with pytest.raises(NoChatTemplateError, match="--chat-template"):
        base.render([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("dtype", ["float16", "fp32", "", None])
def test_bad_dtype_names_the_field(dtype):
    with pytest.raises(InvalidSettingError) as info:
        load_model("tiny-llama", dtype)
    assert info.value.field == "dtype" and "bfloat16" in str(info.value)


@pytest.mark.parametrize(
    "dtype,kv_dtype,why",
    [
        ("float32", "int8", "not supported"),
        ("float32", "bfloat16", "float32 or float16"),
        ("bfloat16", "float16", "keeps bfloat16"),
        ("float32", "", "not supported"),
    ],
)
def test_a_bad_kv_dtype_names_the_field(dtype, kv_dtype, why):
    with pytest.raises(InvalidSettingError) as info:
        load_model("tiny-llama", dtype, kv_dtype=kv_dtype)
    assert info.value.field == "kv_dtype" and why in str(info.value)
