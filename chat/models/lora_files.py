"""LoRA adapter files read into one form: per target linear layer of the decoder, its low-rank update
``delta W = scaling * B @ A`` (``A`` ``[r, in]``, ``B`` ``[out, r]``, float32).

Two sources:

- a PEFT adapter directory: ``adapter_config.json`` + ``adapter_model.safetensors``. Keys are
  ``base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight`` and
  ``...mlp.{gate,up,down}_proj...``. ``scaling`` follows PEFT: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with
  ``use_rslora``; ``rank_pattern`` / ``alpha_pattern`` override ``r`` / ``lora_alpha`` for the modules whose name
  ends with a pattern (the first pattern that matches, as PEFT matches them). What PEFT adds beyond plain LoRA on
  linear layers (DoRA, LoRA biases, ``modules_to_save``, trainable tokens, adapters on embeddings or the LM head) is
  refused with the name of what is not served.
- a llama.cpp GGUF LoRA (``general.type = adapter``, ``adapter.type = lora``): tensors ``blk.{i}.attn_q.weight.lora_a``
  / ``.lora_b`` (``attn_k``, ``attn_v``, ``attn_output``, ``ffn_gate``, ``ffn_up``, ``ffn_down``), ``scaling =
  adapter.lora.alpha / r`` (llama.cpp's rule; an alpha of 0 means 1). Architectures whose GGUF rows are stored in
  another order (llama's q/k) have ``B``'s rows put back in the order of the model's own weights (the same fix the
  base model's weights get when a GGUF file loads: :mod:`chat.models.decoder.names`).

``read_adapter(path, scale)`` reads either; ``scale`` (``--lora NAME=PATH:SCALE``) multiplies every module's
scaling. Every problem is an :class:`~chat.models.errors.AdapterFileError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from chat.models.errors import AdapterFileError

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # our names of the linear layers an adapter may change
PEFT_MODULES = {
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
}
GGUF_MODULES = {
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_output": "o",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_down": "down",
}
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(.*)\.lora_([AB])\.weight$")
_PEFT_MODULE = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
_GGUF_KEY = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")
# adapter_config.json settings that change what the adapter computes and are not served: name -> the value that is
_REFUSED_SETTINGS = {
    "use_dora": False,
    "lora_bias": False,
    "modules_to_save": None,
    "trainable_token_indices": None,
    "target_parameters": None,
    "alora_invocation_tokens": None,
}


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One linear layer's update: ``y += scaling * (x @ a.T) @ b.T``."""

    a: torch.Tensor  # [r, in] float32
    b: torch.Tensor  # [out, r] float32
    scaling: float


@dataclass(frozen=True, slots=True)
class LoraWeights:
    """An adapter as read: its source and its modules by our names (``layers.{i}.{q,k,v,o,gate,up,down}``)."""

    source: str  # the path it was read from
    modules: dict[str, LoraModule]


def read_adapter(path: str | Path, scale: float = 1.0, *, base_config: Any = None) -> LoraWeights:
    """The adapter at ``path`` (a PEFT directory or a GGUF LoRA file), every scaling multiplied by ``scale``.
    ``base_config``: the base model's transformers config (a GGUF adapter's row order fix needs its head counts).

    Raises:
        AdapterFileError: no such path, unreadable or corrupt files, settings or modules that are not served.
    """
    where = Path(path).expanduser()
    if not math.isfinite(scale):
        raise AdapterFileError(where, f"the scale {scale!r} is not a finite number")
    if where.is_dir():
        modules = _read_peft(where)
    elif where.is_file():
        modules = _read_gguf(where, base_config)
    else:
        raise AdapterFileError(where, "no such adapter: give a PEFT adapter directory or a GGUF LoRA file")
    if not modules:
        raise AdapterFileError(where, "the adapter changes no layer")
    scaled = {name: LoraModule(m.a, m.b, m.scaling * scale) for name, m in modules.items()}
    return LoraWeights(str(where), scaled)


# ==================================================================== PEFT directories


def _read_peft(path: Path) -> dict[str, LoraModule]:
    config = _peft_config(path)
    tensors = _safetensors(path / WEIGHTS_FILE)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        found = _PEFT_KEY.match(key)
        if found is None:
            raise AdapterFileError(
                path, f"{WEIGHTS_FILE}: tensor {key!r} is not a LoRA A or B weight of a linear layer"
            )
        pairs.setdefault(found.group(1), {})[found.group(2)] = tensor
    r_default, alpha_default = config.get("r", 8), config.get("lora_alpha", 8)
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora", False))
    modules: dict[str, LoraModule] = {}
    for module, ab in sorted(pairs.items()):
        ours = _our_module(module)
        if ours is None:
            raise AdapterFileError(
                path,
                f"module {module!r} is not one of the linear layers an adapter may change "
                f"({', '.join(PEFT_MODULES)} of a decoder layer)",
            )
        if set(ab) != {"A", "B"}:
            raise AdapterFileError(path, f"module {module!r} has lora_{''.join(ab)} but not both lora_A and lora_B")
        r = rank_pattern.get(_pattern_key(rank_pattern, module), r_default)
        alpha = alpha_pattern.get(_pattern_key(alpha_pattern, module), alpha_default)
        if not isinstance(r, int) or r <= 0 or not isinstance(alpha, int | float) or not math.isfinite(alpha):
            raise AdapterFileError(path, f"module {module!r}: rank {r!r} and lora_alpha {alpha!r} must be numbers")
        a, b = _matrix(path, module, "A", ab["A"]), _matrix(path, module, "B", ab["B"])
        if a.shape[0] != r or b.shape[1] != r:
            raise AdapterFileError(
                path, f"module {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not of rank {r}"
            )
        scaling = alpha / math.sqrt(r) if rslora else alpha / r
        modules[ours] = LoraModule(a, b, float(scaling))
    return modules


def _peft_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterFileError(path, f"a PEFT adapter directory needs {CONFIG_FILE}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterFileError(file, f"not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterFileError(file, "not a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise AdapterFileError(file, f"peft_type {kind!r}: only LORA adapters are served")
    for name, plain in _REFUSED_SETTINGS.items():
        value = config.get(name, plain)
        if value not in (plain, [], {}, False, None):
            raise AdapterFileError(file, f"{name} = {value!r} is not served (plain LoRA on linear layers only)")
    if config.get("bias", "none") != "none":
        raise AdapterFileError(file, f"bias = {config['bias']!r} is not served (LoRA without biases only)")
    return config


def _safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise AdapterFileError(file.parent, f"a PEFT adapter directory needs {WEIGHTS_FILE}")
    try:
        return load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise AdapterFileError(file, f"not a readable safetensors file ({exc})") from None


def _our_module(module: str) -> str | None:
    """``model.layers.3.self_attn.q_proj`` -> ``layers.3.q``; None for anything else."""
    found = _PEFT_MODULE.match(module)
    if found is None or found.group(2) not in PEFT_MODULES:
        return None
    return f"layers.{int(found.group(1))}.{PEFT_MODULES[found.group(2)]}"


def _pattern_key(patterns: dict[str, Any], module: str) -> str:
    """The first of ``patterns`` that ``module``'s name ends with (at a dot), as PEFT picks a rank or alpha
    override; ``module`` itself when none does."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return module


def _matrix(path: Path, module: str, which: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.ndim != 2 or not tensor.is_floating_point():
        raise AdapterFileError(path, f"module {module!r}: lora_{which} is not a 2-D float matrix ({tensor.dtype})")
    out = tensor.float().contiguous()
    if not bool(torch.isfinite(out).all()):
        raise AdapterFileError(path, f"module {module!r}: lora_{which} holds NaN or infinite values")
    return out


# ==================================================================== GGUF LoRA files


def _read_gguf(path: Path, base_config: Any) -> dict[str, LoraModule]:
    reader = _gguf_reader(path)
    fields = {name: _field_value(field) for name, field in reader.fields.items()}
    if fields.get("general.type") != "adapter" or fields.get("adapter.type") != "lora":
        raise AdapterFileError(
            path,
            f"not a GGUF LoRA adapter (general.type {fields.get('general.type')!r}, adapter.type "
            f"{fields.get('adapter.type')!r}; want 'adapter' and 'lora')",
        )
    alpha = float(fields.get("adapter.lora.alpha") or 0.0)
    architecture = str(fields.get("general.architecture", ""))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for tensor in reader.tensors:
        found = _GGUF_KEY.match(tensor.name)
        if found is None or found.group(2) not in GGUF_MODULES:
            raise AdapterFileError(
                path,
                f"tensor {tensor.name!r} is not a LoRA a or b weight of a decoder layer's "
                f"linear layer ({', '.join(GGUF_MODULES)})",
            )
        base = f"blk.{found.group(1)}.{found.group(2)}.weight"
        pairs.setdefault(base, {})[found.group(3)] = _gguf_matrix(path, tensor)
    modules: dict[str, LoraModule] = {}
    for base, ab in sorted(pairs.items()):
        if set(ab) != {"a", "b"}:
            raise AdapterFileError(path, f"{base} has lora_{''.join(ab)} but not both lora_a and lora_b")
        a, b = ab["a"], ab["b"]
        if a.shape[0] != b.shape[1]:
            raise AdapterFileError(path, f"{base}: lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)} differ in rank")
        b = _row_order(b, base, architecture, base_config)
        found = _GGUF_KEY.match(base + ".lora_a")
        assert found is not None
        rank = a.shape[0]
        modules[f"layers.{int(found.group(1))}.{GGUF_MODULES[found.group(2)]}"] = LoraModule(
            a.contiguous(), b.contiguous(), alpha / rank if alpha else 1.0
        )
    return modules


def _gguf_reader(path: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError, KeyError, IndexError, EOFError) as exc:
        raise AdapterFileError(path, f"not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        return None


def _gguf_matrix(path: Path, tensor: Any) -> torch.Tensor:
    import gguf
    import numpy as np

    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, ValueError) as exc:
        raise AdapterFileError(
            path, f"tensor {tensor.name}: type {tensor.tensor_type.name} unreadable ({exc})"
        ) from None
    out = torch.from_numpy(np.array(values, dtype=np.float32))
    if out.ndim != 2:
        raise AdapterFileError(path, f"tensor {tensor.name} is not a matrix (shape {tuple(out.shape)})")
    if not bool(torch.isfinite(out).all()):
        raise AdapterFileError(path, f"tensor {tensor.name} holds NaN or infinite values")
    return out


def _row_order(b: torch.Tensor, base: str, architecture: str, config: Any) -> torch.Tensor:
    """``b`` with its rows in the order of the model's own weight: the row order the decoder's name map undoes for
    the base model's tensor of that name (:data:`chat.models.decoder.names.GGUF_LAYOUTS`: llama's q/k rows)."""
    from chat.models.decoder import names

    found = names.gguf_target(base, architecture) if architecture in names.GGUF_LAYOUTS else None
    if config is None or found is None:
        return b
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    order = names.row_order(found[1], b.shape[0], {"heads": heads, "kv_heads": kv_heads})
    return b if order is None else b[torch.from_numpy(order)]
