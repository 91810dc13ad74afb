"""chat.models.specs: a spec resolved (built-in name, tiny model, GGUF file, directory) and the settings a load is
asked for, checked before anything is read (each refusal a typed error naming its field), and the defaults chosen
when none is asked for."""

from __future__ import annotations

import pytest
import torch

from chat.models.errors import InvalidSettingError, UnknownModelError
from chat.models.kernels import block_matrices, native
from chat.models.specs import (
    GGUF_DEFAULT_WEIGHTS,
    clean_spec,
    directory_of,
    gguf_name,
    is_gguf_spec,
    model_choices,
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


def test_a_spec_is_told_apart_by_its_kind(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"GGUF")  # a file, whatever its name: a GGUF file to read
    assert is_gguf_spec("smollm2") and is_gguf_spec("gemma3-270m")
    assert is_gguf_spec("/no/such/model.GGUF") and is_gguf_spec(str(tmp_path / "model.bin"))
    assert not is_gguf_spec("tiny-llama") and not is_gguf_spec(str(tmp_path)) and not is_gguf_spec("")
    assert gguf_name("smollm2", tmp_path / "x.gguf") == "smollm2"
    assert gguf_name(str(tmp_path / "x.gguf"), tmp_path / "x.gguf") == "x"
    assert directory_of(str(tmp_path)) == (tmp_path, tmp_path.resolve().name, None)


@pytest.mark.parametrize("spec", ["", "   ", None, 3])
def test_a_blank_spec_names_no_model(spec):
    with pytest.raises(UnknownModelError) as info:
        clean_spec(spec)
    assert "smollm2" in str(info.value) and "tiny-llama" in str(info.value)  # what could have been asked
    assert clean_spec("  tiny-llama \n") == "tiny-llama"


def test_no_directory_is_an_unknown_model(tmp_path):
    with pytest.raises(UnknownModelError):
        directory_of(str(tmp_path / "missing"))
    assert {"smollm2", "gemma3-270m", "tiny-llama", "tiny-omni"} <= set(model_choices())


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


def test_checking_settings_loads_no_transformers():
    """``turncache serve`` checks its settings with these before the model loads (chat.server.main)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom chat.models.specs import parse_weights, parse_kv_dtype\n"
        "parse_kv_dtype(None, 'float32', parse_weights(None, 'float32', 'smollm2'))\n"
        "sys.exit('transformers' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
