"""chat.models.registry: the settings a load is asked for, checked before anything is read (each refusal a typed
error naming its field), and the defaults chosen when none is asked for. Loading itself is tested per path
(test_text.py, test_smollm2.py, test_gguf_files.py, hf/test_multimodal.py, ...)."""

from __future__ import annotations

import pytest
import torch

from chat.models.errors import InvalidSettingError, UnknownModelError
from chat.models.kernels import block_matrices, native
from chat.models.registry import (
    GGUF_DEFAULT_WEIGHTS,
    load_model,
    parse_device,
    parse_dtype,
    parse_kv_dtype,
    parse_weights,
)


def refused(field, call, *args):
    with pytest.raises(InvalidSettingError) as caught:
        call(*args)
    assert caught.value.field == field
    return str(caught.value)


def test_dtypes():
    assert parse_dtype("float32") is torch.float32
    assert parse_dtype("bfloat16") is torch.bfloat16
    refused("dtype", parse_dtype, "float16")


def test_weights_default_to_the_dtype_and_a_gguf_file_to_its_rule():
    assert parse_weights(None, "float32", "tiny-llama") == "float32"
    assert parse_weights(None, "bfloat16", "smollm2") == "bfloat16"
    assert parse_weights(None, "float32", "smollm2") == GGUF_DEFAULT_WEIGHTS
    assert parse_weights(None, "float32", "/some/model.gguf") == GGUF_DEFAULT_WEIGHTS
    assert parse_weights("int8", "float32", "tiny-llama") == "int8"


def test_weights_that_cannot_be_had_are_refused():
    refused("weights", parse_weights, "int4", "float32", "tiny-llama")
    assert "needs float32" in refused("weights", parse_weights, "int8", "bfloat16", "tiny-llama")
    assert "not a GGUF file" in refused("weights", parse_weights, "gguf", "float32", "tiny-llama")


def test_kv_dtype_defaults_and_refusals():
    assert parse_kv_dtype(None, "float32", "float32") == "float32"
    assert parse_kv_dtype(None, "bfloat16", "bfloat16") == "bfloat16"
    expected = "float16" if native.kernels() is not None else "float32"  # exact per token only with the kernels
    assert parse_kv_dtype(None, "float32", "int8") == expected
    blocks = "float16" if block_matrices.kernels() is not None else "float32"
    assert parse_kv_dtype(None, "float32", "gguf-q16") == blocks
    assert parse_kv_dtype("float16", "float32", "float32") == "float16"
    refused("kv_dtype", parse_kv_dtype, "int8", "float32", "float32")
    refused("kv_dtype", parse_kv_dtype, "float16", "bfloat16", "bfloat16")
    refused("kv_dtype", parse_kv_dtype, "bfloat16", "float32", "float32")


def test_devices():
    assert parse_device(None, "float32") == torch.device("cpu")
    assert parse_device("cpu", "int8") == torch.device("cpu")
    assert parse_device("meta", "float32") == torch.device("meta")  # no CUDA needed to reach the weights check
    assert "CPU only" in refused("device", parse_device, "meta", "int8")
    assert "CPU only" in refused("device", parse_device, "meta", "gguf")
    refused("device", parse_device, "not-a-device", "float32")
    if not torch.cuda.is_available():
        assert "no CUDA" in refused("device", parse_device, "cuda", "float32")


@pytest.mark.parametrize("spec", ["", "   ", None, 3, "tiny-nonesuch", "/no/such/directory"])
def test_a_spec_that_names_no_model_is_unknown(spec):
    with pytest.raises(UnknownModelError):
        load_model(spec)
