"""chat.models.errors: the error classes of the model adapters, their codes, fields and messages."""

from __future__ import annotations

import pytest

from chat.models import errors
from chat.models.errors import (
    AdapterFileError,
    AdapterMismatchError,
    InvalidSettingError,
    ModelError,
    ModelFileError,
    ModelLoadError,
    RunStateError,
    UnknownAdapterError,
    UnknownModelError,
    UnsupportedArchitectureError,
)

ALL = [
    UnknownModelError,
    UnsupportedArchitectureError,
    InvalidSettingError,
    ModelLoadError,
    ModelFileError,
    AdapterFileError,
    AdapterMismatchError,
    UnknownAdapterError,
    RunStateError,
]


def test_the_tree_and_the_builtin_bases():
    assert all(issubclass(cls, ModelError) for cls in ALL)
    for cls in (ModelLoadError, ModelFileError, AdapterFileError, RunStateError):  # environment or caller problems
        assert issubclass(cls, RuntimeError) and not issubclass(cls, ValueError), cls
    for cls in (UnknownModelError, UnsupportedArchitectureError, InvalidSettingError, AdapterMismatchError):
        assert issubclass(cls, ValueError), cls
    assert issubclass(UnknownAdapterError, KeyError)
    assert issubclass(AdapterFileError, ModelFileError) and issubclass(ModelFileError, ModelLoadError)


def test_every_class_has_its_own_code():
    classes = [getattr(errors, name) for name in dir(errors) if isinstance(getattr(errors, name), type)]
    codes = [cls.code for cls in classes if issubclass(cls, ModelError)]
    assert len(codes) == len(ALL) + 1 and len(set(codes)) == len(codes)


def test_messages_name_what_was_wrong_and_what_is_accepted():
    unknown = UnknownModelError("gpt-17", ["smollm2", "tiny-llama"])
    assert unknown.spec == "gpt-17" and unknown.choices == ("smollm2", "tiny-llama")
    assert "'gpt-17'" in str(unknown) and "smollm2, tiny-llama" in str(unknown) and "GGUF" in str(unknown)
    refused = UnsupportedArchitectureError("mamba", "recurrent only", ["llama", "qwen2"])
    assert str(refused) == "model family 'mamba' is not supported: recurrent only. Supported families: llama, qwen2"
    setting = InvalidSettingError("dtype", "use float32")
    assert setting.field == "dtype" and str(setting) == "dtype: use float32"
    bad_file = AdapterFileError("/x/a.gguf", "truncated")
    assert (bad_file.path, bad_file.problem, str(bad_file)) == ("/x/a.gguf", "truncated", "/x/a.gguf: truncated")
    mismatch = AdapterMismatchError("layers.3.q", "has 16 rows")
    assert mismatch.module == "layers.3.q" and str(mismatch) == "the adapter's module layers.3.q: has 16 rows"


def test_an_unknown_adapter_reads_as_a_sentence_not_a_quoted_key():
    with pytest.raises(KeyError) as info:
        raise UnknownAdapterError("fr")
    assert info.value.name == "fr"
    assert str(info.value) == "no LoRA adapter named 'fr' is loaded"  # KeyError would have quoted it
