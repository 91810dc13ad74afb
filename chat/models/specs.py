"""What a load is asked for, resolved and checked before anything is read: the spec (a built-in name, a tiny model, a
GGUF file or a model directory: see :mod:`chat.models.registry`), the dtype, the weight format, the K/V dtype and the
device, each refusal a typed error naming its field, and the defaults chosen when none is asked for.

Nothing here imports transformers: ``turncache serve`` checks its settings with it before the model loads
(``chat.server.main``), and both the loader (:mod:`chat.models.registry`) and the renderer
(:mod:`chat.models.renderer_loading`) resolve their specs through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from chat.models import gemma3_270m, smollm2
from chat.models.errors import InvalidSettingError, UnknownModelError
from chat.models.kernels import block_matrices, native
from chat.models.kernels.block_matrices import BLOCK_FORMATS
from chat.models.kernels.matrices import WEIGHT_FORMATS
from chat.models.tiny.media import TINY_MM
from chat.models.tiny.text import tiny_names

DTYPES = ("float32", "bfloat16")
DEFAULT_CONTEXT = 4096  # when a config names no maximum
# The weight format of a GGUF file (the built-in model is one) when none is asked for, chosen by the rule of issue 35:
# the fastest format whose next-token agreement with the file's float32 dequantization is >= 0.99 and whose
# perplexity ratio is <= 1.005 (`turncache bench weights`: meets_default_rule, default_rule_format). Measured
# (docs/benchmarks.md): gguf-q16 and gguf agree 1.000 (ratio 1.000), gguf-q8 0.958, int8 0.900 (ratio 1.019), so
# only gguf and gguf-q16 qualify, and gguf-q16 is the faster of the two at 8 sessions. int8 stays a flag: the
# throughput choice. Fixed here, never measured at start.
GGUF_DEFAULT_WEIGHTS = "gguf-q16"
DEFAULT_WEIGHTS: dict[str, str] = {}  # a model's own default where it differs from the rule's (none today)
KV_DTYPES = ("float32", "float16", "bfloat16")  # what attention K/V can be stored in
BUILT_IN_GGUF = (smollm2.NAME, gemma3_270m.NAME)  # the built-in models: GGUF files found by name


def model_choices() -> list[str]:
    """The model names a spec may give besides a path (what an unknown spec's error lists)."""
    return [*BUILT_IN_GGUF, *tiny_names(), *(f"tiny-{name}" for name in TINY_MM)]


# ==================================================================== specs


def clean_spec(spec: Any) -> str:
    """``spec`` without surrounding blanks. Raises UnknownModelError when it is no string or blank."""
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError(repr(spec), model_choices())
    return spec.strip()


def is_gguf_spec(spec: str) -> bool:
    """Whether ``spec`` names a GGUF file: a built-in model, a ``.gguf`` path, or a file that is no directory."""
    if spec in BUILT_IN_GGUF:
        return True
    if not spec or spec.startswith("tiny-"):
        return False
    path = Path(spec).expanduser()
    return path.suffix.lower() == ".gguf" or path.is_file()


def gguf_file(spec: str) -> Path | None:
    """The GGUF file ``spec`` names (the built-in model's inside its wheel; gemma3-270m's assembled from its
    packages), or None for a directory.

    Raises:
        ModelLoadError: the built-in model's wheel is missing; a gemma3-270m chunk package is missing, truncated or
            corrupt (named).
    """
    if spec == smollm2.NAME:
        return smollm2.locate_gguf()
    if spec == gemma3_270m.NAME:
        return gemma3_270m.locate_gguf()
    return Path(spec).expanduser() if is_gguf_spec(spec) else None


def gguf_name(spec: str, path: Path) -> str:
    """The name a GGUF file is served under: a built-in model's name, else the file's name without ``.gguf``."""
    return spec if spec in BUILT_IN_GGUF else path.name.removesuffix(".gguf")


def directory_of(spec: str) -> tuple[Path, str, str | None]:
    """The model directory of ``spec``, the name it is served under, and the digest that stands for its weights in
    the fingerprint (None: hash the weight files).

    Raises:
        UnknownModelError: ``spec`` is no directory.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return path, path.resolve().name, None
    raise UnknownModelError(spec, model_choices())


# ==================================================================== settings


def parse_dtype(dtype: str) -> Any:
    """The torch dtype of ``dtype``. Raises InvalidSettingError (``field == "dtype"``) unless one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise InvalidSettingError("dtype", f"{dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def parse_weights(weights: str | None, dtype: str, spec: str = "") -> str:
    """The weight format to load ``spec`` with: ``weights``, or when None the model's default (for a float32 load:
    :data:`DEFAULT_WEIGHTS`, else :data:`GGUF_DEFAULT_WEIGHTS` for a GGUF file, else float32; otherwise the dtype's
    own). The block formats (``gguf``, ``gguf-q8``, ``gguf-q16``) need a GGUF file (the built-in model is one)."""
    gguf = is_gguf_spec(spec)
    if weights is None:
        if dtype != "float32":
            return dtype
        return DEFAULT_WEIGHTS.get(spec, GGUF_DEFAULT_WEIGHTS if gguf else dtype)
    if weights not in WEIGHT_FORMATS:
        raise InvalidSettingError("weights", f"{weights!r} is not supported; use one of {', '.join(WEIGHT_FORMATS)}")
    if dtype != "float32" and weights != dtype:
        raise InvalidSettingError("weights", f"a {dtype} model keeps {dtype} weights; {weights} needs float32")
    if weights in BLOCK_FORMATS and spec and not gguf:
        raise InvalidSettingError("weights", f"{weights} keeps a GGUF file's blocks; {spec} is not a GGUF file")
    return weights


def parse_kv_dtype(kv_dtype: str | None, dtype: str, weights: str) -> str:
    """What a model loaded in ``dtype`` with ``weights`` stores its attention K/V in: ``kv_dtype``, or when None the
    default: ``float16`` for int8 weights where the native attention kernel reads it
    (:mod:`chat.models.kernels.native`), else the dtype's own. float16 K/V take half the memory and half the attention
    traffic of float32 (next-token agreement 1.0 with float32 K/V on smollm2's texts, docs/benchmarks.md). With int8
    weights, whose products are exact per token, a position's K/V round the same way however its prompt was cut, so
    cached turns stay bit for bit those computed from scratch; so are the block formats' products with the native block
    kernels (a GGUF file some of whose layers run in float32 gets float32 K/V:
    :func:`chat.models.registry.load_gguf_file`); with float32 weights, the last-bit differences of other chunkings
    can move a float16 rounding (about 1e-3 in the logits), so float16 is chosen there only when asked for. A float32
    model computes in float32 either way; a bfloat16 model keeps bfloat16 K/V."""
    if kv_dtype is None:
        if dtype != "float32" or weights not in ("int8", *BLOCK_FORMATS):
            return dtype
        if weights in BLOCK_FORMATS:  # exact per token only with the block kernels
            return "float16" if block_matrices.kernels() is not None else "float32"
        return "float16" if native.kernels() is not None else "float32"
    if kv_dtype not in KV_DTYPES:
        raise InvalidSettingError("kv_dtype", f"{kv_dtype!r} is not supported; use one of {', '.join(KV_DTYPES)}")
    if dtype != "float32" and kv_dtype != dtype:
        raise InvalidSettingError("kv_dtype", f"a {dtype} model keeps {dtype} K/V; {kv_dtype} needs float32")
    if dtype == "float32" and kv_dtype == "bfloat16":
        raise InvalidSettingError("kv_dtype", "a float32 model stores float32 or float16 K/V")
    return kv_dtype


def parse_device(device: str | None, weights: str) -> Any:
    """The torch device a model computes on: ``device`` (None: the CPU). int8 weights and a GGUF file's block
    formats run on the CPU only (their kernels are CPU kernels).

    Raises:
        InvalidSettingError: not a torch device name, a device torch cannot reach here, or int8 or a block format
            off the CPU (``field == "device"``).
    """
    if device is None:
        return torch.device("cpu")
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidSettingError("device", f"{device!r} is not a torch device ({exc})") from exc
    if where.type == "cpu":
        return where
    if where.type == "cuda" and not torch.cuda.is_available():
        raise InvalidSettingError("device", f"{device!r}: torch sees no CUDA device here")
    if weights == "int8" or weights in BLOCK_FORMATS:
        raise InvalidSettingError("device", f"{weights} weights run on the CPU only, not on {device!r}")
    return where
