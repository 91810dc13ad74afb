"""Errors of the model adapters. Every one says what was wrong and what is accepted instead::

    ModelError
    ├── UnknownModelError              a spec that is neither a built-in name, a tiny model, nor a model directory
    ├── UnsupportedArchitectureError   a model family this adapter refuses (``.architecture`` names it)
    ├── InvalidSettingError            a setting out of range (``.field`` names it, e.g. "dtype")
    ├── ModelLoadError                 a model directory or the built-in weights could not be read or converted
    │   ├── ModelFileError             a model file (GGUF) that is missing, not GGUF, truncated or corrupt, or holds
    │   │                              tensor types that cannot be read (``.path``)
    │   └── AdapterFileError           a LoRA adapter path that is missing, unreadable, corrupt, or holds settings
    │                                  or modules that are not served (``.path``)
    ├── AdapterMismatchError           a LoRA adapter whose layers or shapes do not fit the base model (``.module``)
    ├── UnknownAdapterError            no adapter is loaded under that name (``.name``)
    └── RunStateError                  a run or lease that does not fit this model (wrong layout, nothing to export)

All derive from ``ValueError`` too, except :class:`ModelLoadError` (an environment problem or a bad file) and
:class:`RunStateError` (a caller bug), which derive from ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Iterable


class ModelError(Exception):
    """Base class of every error raised by :mod:`chat.models`."""

    code = "model_error"


class UnknownModelError(ModelError, ValueError):
    """The spec names no model: not a built-in name, not a tiny model, not a directory."""

    code = "unknown_model"

    def __init__(self, spec: str, choices: Iterable[str]) -> None:
        self.spec = spec  # what was asked for
        self.choices = tuple(choices)  # the names that are accepted
        super().__init__(
            f"unknown model {spec!r}: use one of {', '.join(self.choices)}, the path of a local Hugging Face "
            "model directory (config.json, weights, tokenizer), or of a GGUF file"
        )


class UnsupportedArchitectureError(ModelError, ValueError):
    """The model family is known to transformers but not served by this adapter."""

    code = "unsupported_architecture"

    def __init__(self, architecture: str, reason: str, supported: Iterable[str]) -> None:
        self.architecture = architecture  # the config's model_type
        self.reason = reason  # why it is refused
        self.supported = tuple(supported)  # model families that are served
        super().__init__(
            f"model family {architecture!r} is not supported: {reason}. Supported families: {', '.join(self.supported)}"
        )


class InvalidSettingError(ModelError, ValueError):
    """A setting has a value outside what is accepted."""

    code = "invalid_setting"

    def __init__(self, field: str, message: str) -> None:
        self.field = field  # the setting, e.g. "dtype"
        super().__init__(f"{field}: {message}")


class ModelLoadError(ModelError, RuntimeError):
    """Files could not be read, converted or written (missing files, a corrupt package, a full disk)."""

    code = "model_load_failed"


class ModelFileError(ModelLoadError):
    """A model file cannot be served as it is; the message names the file and what is wrong with it."""

    code = "model_file_invalid"

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)  # the file, as given
        self.problem = problem  # what is wrong with it, and what is accepted instead
        super().__init__(f"{self.path}: {problem}")


class RunStateError(ModelError, RuntimeError):
    """A run or a lease was used with a model it does not belong to, or in a state that cannot serve the call."""

    code = "run_state"


class AdapterFileError(ModelFileError):
    """A LoRA adapter (PEFT directory or GGUF LoRA file) cannot be read or holds what is not served."""

    code = "adapter_file_invalid"


class AdapterMismatchError(ModelError, ValueError):
    """A LoRA adapter does not fit the base model: a layer it changes is not there, or has other shapes."""

    code = "adapter_mismatch"

    def __init__(self, module: str, problem: str) -> None:
        self.module = module  # the adapter's module (our name, e.g. "layers.3.q") that does not fit
        super().__init__(f"the adapter's module {module}: {problem}")


class UnknownAdapterError(ModelError, KeyError):
    """No LoRA adapter is loaded under the name asked for."""

    code = "unknown_adapter"

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no LoRA adapter named {name!r} is loaded")

    def __str__(self) -> str:
        return str(self.args[0])
