"""Everything turncache changes in a loaded transformers model, in one place: :func:`install`. Only the models that
keep transformers' forward are patched (:class:`chat.models.adapter.TransformersAdapter`: hybrid recurrent and
multimodal models); the families of :mod:`chat.models.decoder.model` run on turncache's own forward, untouched by this.

::

    patches = install(model, weights="int8")   # once, after loading (the adapter does it)

What :func:`install` does to the decoder stack it is given (a multimodal model's text stack: vision and audio
encoders keep their own layers and attention):

- **Attention.** The decoder config's attention implementation becomes :data:`chat.models.hf.ragged.RAGGED_ATTENTION`:
  every forward of the adapter runs inside a pack of runs, each attending to its own K/V rows
  (:mod:`chat.models.hf.ragged`).
- **Linear layers in the chosen weight format** (:data:`WEIGHT_FORMATS`). Every plain ``nn.Linear`` (the LM head
  too, untied from the embedding if it was tied) becomes a :class:`FastLinear` over a matrix of that format
  (:mod:`chat.models.kernels.matrices`; float32 keeps the same parameters, nothing copied). For int8, activation
  outliers are first moved into the weights where the layers allow it (:mod:`chat.models.smoothing`).

- **Norms.** RMSNorms that scale by their weight run as one ``F.rms_norm`` call (:class:`FastRMSNorm`).
- **Fused projections.** Sibling ``q_proj`` / ``k_proj`` / ``v_proj`` (and ``gate_proj`` / ``up_proj``) layers that
  read the same input become :class:`FusedPart` modules over one matrix: the first part of a group computes every
  part at once (one activation quantization in int8) and keeps the result, the others take their slice when called
  with the same input tensor (and compute their own slice otherwise, e.g. in cross-attention). In float32 and
  bfloat16 only for up to :data:`FEW_ROWS` rows (MKL's GEMMs over 256 rows were ~20% slower on the fused matrices);
  in int8 always.

Only float32 ``nn.Linear`` layers are rewritten (a bfloat16 model keeps its own). Memory: float32 keeps the loaded
parameters; the other formats keep only their own copies (the embedding stays float32 for its lookups, so a tied LM
head costs one extra copy in the chosen format). Not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from chat.models import smoothing
from chat.models.hf import ragged
from chat.models.kernels import native
from chat.models.kernels.dense_matrices import (
    FEW_ROWS,
    BFloat16Matrix,
    BlasForms,
    Float32Matrix,
    Int8Matrix,
    calibrate,
    int8_linear,
    quantize_weight,
)
from chat.models.kernels.matrices import MATRICES, WEIGHT_FORMATS

__all__ = [  # the matrices live in chat.models.kernels.dense_matrices and .matrices; these names stay importable
    # from here
    "FEW_ROWS",
    "WEIGHT_FORMATS",
    "BFloat16Matrix",
    "Float32Matrix",
    "Int8Matrix",
    "Patches",
    "install",
    "int8_linear",
    "quantize_weight",
]

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # sibling layers fused, in output order


# ==================================================================== layers


class FastLinear(nn.Module):
    """An ``nn.Linear`` computing through a matrix of the chosen format (same function, up to that format's
    rounding)."""

    def __init__(self, original: nn.Linear, matrix: Any) -> None:
        super().__init__()
        if isinstance(matrix, Float32Matrix):  # the same parameter objects: ties and the state dict are unchanged
            self.weight, self.bias = original.weight, original.bias
        self.in_features, self.out_features = original.in_features, original.out_features
        self.matrix = matrix  # Float32Matrix | BFloat16Matrix | Int8Matrix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matrix(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {type(self.matrix).__name__}"


class _FusedGroup:
    """The shared state of one group of fused layers (not a module: the state dict never sees it)."""

    def __init__(self, matrix: Any, bounds: list[tuple[int, int]]) -> None:
        self.matrix = matrix  # every part's outputs, [sum of outs, in]
        self.bounds = bounds  # part i's outputs: columns [lo, hi) of the fused result
        self.input: torch.Tensor | None = None  # what the first part was last called with
        self.output: torch.Tensor | None = None  # every part's result for `input`, until all parts took theirs
        self.pending = 0  # parts still to take their slice of `output`


class FusedPart(FastLinear):
    """One layer of a fused group; computes what the ``nn.Linear`` it replaces computes."""

    def __init__(self, original: nn.Linear, matrix: Any, group: _FusedGroup, index: int) -> None:
        super().__init__(original, matrix)
        self.index = index  # position in the group
        self._group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self._group
        if x.numel() > g.matrix.fuse_rows * x.shape[-1]:  # e.g. a float32 prefill: the separate matrices are faster
            return self.matrix(x)
        if self.index == 0:  # the group's first layer: every part at once
            g.input, g.output, g.pending = x, g.matrix(x), len(g.bounds) - 1
        elif x is not g.input or g.output is None:  # another input: this part alone
            g.input = g.output = None
            return self.matrix(x)
        lo, hi = g.bounds[self.index]
        out = g.output[..., lo:hi].contiguous()
        if self.index:
            g.pending -= 1
            if g.pending == 0:
                g.input = g.output = None
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, part={self.index} of {len(self._group.bounds)}"


class FastRMSNorm(nn.Module):
    """An RMSNorm that scales by its weight (:data:`chat.models.smoothing.NORMS`) as one ``F.rms_norm`` call."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.weight = original.weight  # the same parameter
        self.eps = float(original.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


# ==================================================================== install


@dataclass(eq=False)
class Patches:
    """What :func:`install` changed in one model."""

    model: nn.Module  # the transformers model (or a multimodal model's text stack)
    weights: str  # the weight format of its linear layers
    replaced: list[tuple[nn.Module, str, nn.Linear | None, FastLinear]] = field(default_factory=list)  # (parent,
    # name, stock layer (None once dropped: non-float32 formats), its replacement) for every rewritten layer
    forms: dict[tuple[int, int], BlasForms] = field(default_factory=dict)  # float32 weight shape -> BLAS forms
    attention: list[tuple[Any, Any]] = field(default_factory=list)  # (decoder config, its attention implementation
    # as loaded): switched to chat.models.hf.ragged's
    smoothed: int = 0  # linear inputs smoothed before int8 quantization (chat.models.smoothing)
    norms: list[tuple[nn.Module, str, nn.Module, FastRMSNorm]] = field(default_factory=list)  # (parent, name,
    # stock norm, its replacement)

    @property
    def fused_names(self) -> list[str]:
        """Dotted names of the fused layers (for tests and reports)."""
        names = {id(m): n for n, m in self.model.named_modules()}
        return [f"{names[id(p)]}.{n}".lstrip(".") for p, n, _, layer in self.replaced if isinstance(layer, FusedPart)]


def install(
    model: nn.Module,
    weights: str = "float32",
    *,
    calibrate_kernels: bool = True,
    calibration: list[int] | None = None,
) -> Patches:
    """Rewrite ``model`` in place (see the module docstring) and return what was done. Without
    ``calibrate_kernels`` every float32 shape keeps :class:`~chat.models.kernels.matrices.BlasForms`' defaults (for
    tests). For int8, token ids in ``calibration`` smooth the activations first (:mod:`chat.models.smoothing`).

    Raises:
        ValueError: ``weights`` is not one of :data:`WEIGHT_FORMATS`.
    """
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    patches = Patches(model, weights)
    native.kernels()  # built (once per machine) or loaded now, at load time, rather than by the first request
    make = MATRICES[weights]
    if weights == "int8" and calibration:
        patches.smoothed = smoothing.smooth(model, calibration)
    with torch.inference_mode(False), torch.no_grad():
        groups = _fuse(patches, make)
        _wrap_others(patches, make)
        _fuse_norms(patches)
    if weights == "float32":
        _calibrate(patches, groups, calibrate_kernels)
    else:  # the loaded layers are dropped: only the chosen format's copies stay in memory
        patches.replaced = [(p, n, None, layer) for p, n, _, layer in patches.replaced]
        _own_memory(model)
    ragged.register()
    for config in _decoder_configs(model):
        patches.attention.append((config, getattr(config, "_attn_implementation_internal", None)))
        config._attn_implementation_internal = ragged.RAGGED_ATTENTION
    return patches


def _own_memory(model: nn.Module) -> None:
    """Copy the parameters and buffers that stay (embeddings, norms) out of the memory they were loaded into, which
    stays resident while any tensor still points into it (measured on the built-in model in int8: resident memory
    after loading 1,043 MiB without these copies, 638 MiB with them)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()


def _fuse(patches: Patches, make: type) -> list[_FusedGroup]:
    """Replace each group of :data:`FUSED_GROUPS` siblings by :class:`FusedPart` modules over one matrix."""
    shared = _shared_parameters(patches.model)
    groups: list[_FusedGroup] = []
    for parent in list(patches.model.modules()):
        for names in FUSED_GROUPS:
            layers = _fusable(parent, names)
            if layers is None or any(id(p) in shared for m in layers for p in m.parameters()):
                continue
            weight = torch.cat([m.weight.data for m in layers])  # [sum of outs, in]
            bias = torch.cat([m.bias.data for m in layers]) if layers[0].bias is not None else None
            bounds, lo = [], 0
            for m in layers:
                bounds.append((lo, lo + m.out_features))
                lo += m.out_features
            matrix = make.from_layers(layers) if hasattr(make, "from_layers") else make(weight, bias)
            group = _FusedGroup(matrix, bounds)
            for i, (name, m) in enumerate(zip(names, layers, strict=True)):
                if make is Float32Matrix:  # the parts' weights become views of the fused matrix: held once
                    m.weight.data = weight[bounds[i][0] : bounds[i][1]]
                    if bias is not None:
                        m.bias.data = bias[bounds[i][0] : bounds[i][1]]
                part = FusedPart(m, group.matrix.rows(*bounds[i]), group, i)
                setattr(parent, name, part)
                patches.replaced.append((parent, name, m, part))
            groups.append(group)
    return groups


def _wrap_others(patches: Patches, make: type) -> None:
    """Every other plain float32 ``nn.Linear`` becomes a :class:`FastLinear`."""
    for parent in list(patches.model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.dim() == 2:
                matrix = make.from_layers([child]) if hasattr(make, "from_layers") else make(child.weight, child.bias)
                layer = FastLinear(child, matrix)
                setattr(parent, name, layer)
                patches.replaced.append((parent, name, child, layer))


def _fuse_norms(patches: Patches) -> None:
    """Every float32 RMSNorm of a known kind becomes a :class:`FastRMSNorm` (one operation instead of six)."""
    for parent in list(patches.model.modules()):
        for name, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            known = type(child).__name__ in smoothing.NORMS and hasattr(child, "variance_epsilon")
            if known and isinstance(weight, torch.Tensor) and weight.dtype == torch.float32:
                norm = FastRMSNorm(child)
                setattr(parent, name, norm)
                patches.norms.append((parent, name, child, norm))


def _calibrate(patches: Patches, groups: list[_FusedGroup], timed: bool) -> None:
    matrices = [g.matrix for g in groups] + [layer.matrix for *_, layer in patches.replaced]
    by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
    for m in matrices:
        by_shape.setdefault(tuple(m.weight.shape), []).append(m.weight)
    for shape, tensors in by_shape.items():
        patches.forms[shape] = calibrate(tensors) if timed else BlasForms()
    for m in matrices:
        m.forms = patches.forms[tuple(m.weight.shape)]
    for *_, layer in patches.replaced:  # a fused part's matrix shares its BLAS forms with the fused group's
        if isinstance(layer, FusedPart):
            layer.matrix.forms = layer._group.matrix.forms


def _fusable(parent: nn.Module, names: tuple[str, ...]) -> list[nn.Linear] | None:
    layers = [getattr(parent, n, None) for n in names]
    if not all(type(m) is nn.Linear for m in layers):
        return None
    first = layers[0]
    same = all(
        m.in_features == first.in_features
        and m.weight.dtype == torch.float32
        and m.weight.device == first.weight.device
        and (m.bias is None) == (first.bias is None)
        for m in layers
    )
    return layers if same else None


def _shared_parameters(model: nn.Module) -> set[int]:
    """ids of parameters held by more than one module (tied, or a layer reachable twice): those are not fused."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None:
                holders[id(param)] = holders.get(id(param), 0) + 1
    return {key for key, count in holders.items() if count > 1}


def _decoder_configs(model: nn.Module) -> list[Any]:
    """The config the model's decoder layers read: the top config of a causal LM, the text config of a multimodal
    model (whose encoders keep theirs)."""
    config = getattr(model, "config", None)
    if config is None:
        return []
    return [config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config]
