"""Everything turncache changes in a loaded transformers model, in one place: :func:`install`.

::

    patches = install(model, weights="int8")   # once, after loading (the adapter does it)
    with patches.stock() as model:             # float32 weights only: the model exactly as loaded, for baselines
        model.generate(...)

What :func:`install` does to the decoder stack it is given (a multimodal model's text stack: vision and audio
encoders keep their own layers and attention):

- **Attention.** The decoder config's attention implementation becomes :data:`chat.models.ragged.RAGGED_ATTENTION`:
  every forward of the adapter runs inside a pack of runs, each attending to its own K/V rows
  (:mod:`chat.models.ragged`).
- **Linear layers in the chosen weight format** (:data:`WEIGHT_FORMATS`). Every plain ``nn.Linear`` (the LM head
  too, untied from the embedding if it was tied) becomes a :class:`FastLinear` over a matrix of that format:

  - ``float32``: the same parameters (nothing copied, row-major as loaded); 1 row and 2-:data:`FEW_ROWS` rows run the
    faster of two BLAS forms for their weight shape, chosen once per shape by timing both (:func:`calibrate`): one
    row by ``F.linear`` (a GEMV) or as a two-row ``torch.mm`` (a GEMM, faster with 2 threads here), a few rows by
    ``F.linear`` or ``torch.mm(weight, x.T)``; more rows always by ``F.linear``.
  - ``bfloat16``: bf16 weights; activations are rounded to bf16 for the product, the result goes back to float32.
  - ``int8``: int8 weights with one float32 scale per output channel (symmetric), activations quantized per token
    (symmetric, their own absolute maximum -> 127) just before each product, computed with int32 accumulation by
    turncache's native kernel (:mod:`chat.models.native`, which keeps only its packed copy of the weight) or, without
    it, by ``torch._int_mm``: the same numbers either way. A token's result depends only on that token, never on
    the rest of the batch, so a batched forward gives what a forward alone gives. Activation outliers are first
    moved into the weights where the layers allow it (:mod:`chat.models.smoothing`).

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

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from chat.models import block_matrices, native, ragged, smoothing

WEIGHT_FORMATS = ("float32", "bfloat16", "int8", *block_matrices.BLOCK_FORMATS)
FEW_ROWS = 16  # most rows (tokens) a float32 layer runs with its calibrated few-rows kernel, or fused
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # sibling layers fused, in output order
_CALIBRATION_ROWS = 5  # rows the few-rows kernels are timed with (a verification of 4 draft tokens)
_CALIBRATION_ROUNDS = 5  # interleaved timing rounds per shape; the fastest round counts


# ==================================================================== float32 kernels


@dataclass(slots=True)
class Kernels:
    """Which BLAS form a float32 weight shape runs with (see the module docstring)."""

    one_as_gemm: bool = False  # one row: a two-row torch.mm instead of F.linear
    few_as_mm: bool = True  # 2..FEW_ROWS rows: torch.mm(weight, x.T) instead of F.linear


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernels: Kernels) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the kernel ``kernels`` picks for ``x``'s number of rows."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 1 and kernels.one_as_gemm:
        flat = x.reshape(1, -1)
        out = _mm_t(weight, torch.cat([flat, flat]), bias)[:1]  # [1, out]
    elif 1 < rows <= FEW_ROWS and kernels.few_as_mm:
        out = _mm_t(weight, x.reshape(rows, -1), bias)  # [rows, out]
    else:
        return F.linear(x, weight, bias)
    return out.contiguous().view(*x.shape[:-1], weight.shape[0])


def _mm_t(weight: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``rows @ weight.T (+ bias)`` as ``(weight @ rows.T).T``: ``[n, out]``, not contiguous."""
    if bias is None:
        return torch.mm(weight, rows.t()).t()
    return torch.addmm(bias.unsqueeze(1), weight, rows.t()).t()


def calibrate(weights: Sequence[torch.Tensor], rounds: int = _CALIBRATION_ROUNDS) -> Kernels:
    """Time both forms for one row and for a few rows on ``weights`` (all of one shape, used in turn so that they
    come from memory as in a forward) and keep the faster of each."""
    k = weights[0].shape[1]
    one, two, few = (torch.ones(n, k, dtype=weights[0].dtype, device=weights[0].device) for n in (1, 2, 5))
    forms = {
        "one_linear": lambda w: F.linear(one, w),
        "one_gemm": lambda w: torch.mm(w, two.t()),
        "few_linear": lambda w: F.linear(few, w),
        "few_mm": lambda w: torch.mm(w, few.t()),
    }
    best = dict.fromkeys(forms, float("inf"))
    with torch.inference_mode():
        for _ in range(rounds):
            for name, form in forms.items():
                start = time.perf_counter()
                for w in weights:
                    form(w)
                best[name] = min(best[name], time.perf_counter() - start)
    return Kernels(one_as_gemm=best["one_gemm"] < best["one_linear"], few_as_mm=best["few_mm"] < best["few_linear"])


# ==================================================================== matrices, one per format


class Float32Matrix:
    """A float32 ``[out, in]`` weight (row-major, as loaded) and its calibrated kernels."""

    fuse_rows = FEW_ROWS  # most rows for which a fused group computes all parts at once

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight  # [out, in] float32 (a Parameter, or a view of a fused matrix)
        self.bias = bias  # [out] or None
        self.kernels = Kernels()  # set by calibration

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.kernels)

    def rows(self, lo: int, hi: int) -> Float32Matrix:
        part = Float32Matrix(self.weight[lo:hi], None if self.bias is None else self.bias[lo:hi])
        part.kernels = self.kernels
        return part


class BFloat16Matrix:
    """A bfloat16 ``[out, in]`` weight; products are computed in bf16 and returned as float32."""

    fuse_rows = FEW_ROWS

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.detach().to(torch.bfloat16).contiguous()  # [out, in]
        self.bias = None if bias is None else bias.detach().float()  # [out], added in float32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x.to(torch.bfloat16), self.weight).float()
        return out if self.bias is None else out + self.bias

    def rows(self, lo: int, hi: int) -> BFloat16Matrix:
        part = BFloat16Matrix.__new__(BFloat16Matrix)
        part.weight, part.bias = self.weight[lo:hi], None if self.bias is None else self.bias[lo:hi]
        return part


class Int8Matrix:
    """An int8 ``[out, in]`` weight with one float32 scale per output channel (symmetric); see :func:`int8_linear`.

    With the native kernels (:mod:`chat.models.native`) the weight is kept only in their packed layout and every
    product runs there (the same numbers, bit for bit); without them, row-major for ``torch._int_mm``."""

    fuse_rows = 1 << 30  # always fused: the activations are quantized once for the whole group

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        q, scale = quantize_weight(weight)
        self.in_features = q.shape[1]
        self.scale = scale  # [out] float32
        self.bias = None if bias is None else bias.detach().float()  # [out]
        self._step = scale / 127.0  # weight step x activation step per unit of |x| max: what int32 sums are worth
        self.kernels = native.kernels()
        self.q: torch.Tensor | None = None  # [out, in] int8 for torch._int_mm (without the native kernels)
        self.packed: torch.Tensor | None = None  # the native kernels' layout of q (with them)
        self.wsum: torch.Tensor | None = None  # [out] int32: q's row sums, which the native kernel needs
        self.columns: tuple[int, int] | None = None  # a part that computes its whole group: its outputs in there
        if self.kernels is None:
            self.q = q
        else:
            self.packed, self.wsum = self.kernels.pack_int8(q), q.sum(dim=1, dtype=torch.int32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            assert self.q is not None
            return int8_linear(x, self.q, self.scale, self.bias, step=self._step)
        assert self.packed is not None and self.wsum is not None
        rows = x.reshape(-1, x.shape[-1])
        if rows.stride(-1) != 1 or rows.dtype != torch.float32:
            rows = rows.float().contiguous()
        out = self.kernels.int8_linear(rows, self.packed, self.wsum, self._step, self.bias)
        if self.columns is not None:
            out = out[:, self.columns[0] : self.columns[1]].contiguous()
        return out.view(*x.shape[:-1], out.shape[-1])

    def rows(self, lo: int, hi: int) -> Int8Matrix:
        """Output channels ``[lo, hi)`` as a matrix of their own, sharing this one's memory."""
        part = Int8Matrix.__new__(Int8Matrix)
        part.kernels, part.columns, part.in_features = self.kernels, None, self.in_features
        part.scale, part._step = self.scale[lo:hi], self._step[lo:hi]
        part.bias = None if self.bias is None else self.bias[lo:hi]
        part.q = None if self.q is None else self.q[lo:hi]
        part.packed, part.wsum = self.packed, self.wsum
        if self.packed is not None and self.wsum is not None:
            if lo % native.INT8_CHANNEL_ALIGN == 0:  # the packed rows of these channels start where they are
                assert self.q is None
                part.packed = self.packed[native.packed_offset(lo, self.in_features) :]
                part.wsum = self.wsum[lo:hi]
            else:  # computes its whole group and keeps its columns (only when called apart from its group)
                part._step, part.bias, part.columns = self._step, self.bias, (lo, hi)
        return part


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: int8 ``[out, in]`` (row-major) and float32 ``[out]`` with ``weight ~ q * scale[:, None]``, each
    output channel scaled so that its absolute maximum is 127."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [out]: the weight's quantization step per channel
    return torch.round(w / scale.unsqueeze(1)).to(torch.int8), scale


def int8_linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    step: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ (q * scale[:, None]).T (+ bias)`` with ``x`` quantized per token: each row of ``x`` is scaled so that its
    absolute maximum is 127, rounded to int8, multiplied by the int8 weights with int32 accumulation
    (``torch._int_mm``), and scaled back. Float32 in, float32 out. ``step`` (= ``scale / 127``) may be passed
    precomputed. Written with as few tensor operations as the arithmetic allows: a decode step calls it ~120 times,
    and each operation costs about a microsecond of dispatch."""
    rows = x.reshape(-1, x.shape[-1])  # [m, in]
    amax = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12)  # [m, 1]
    quantized = rows.div(amax).mul_(127.0).round_().to(torch.int8)  # |values| <= 127
    out = torch._int_mm(quantized, q.t()).mul(amax).mul_(scale / 127.0 if step is None else step)  # [m, out]
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], q.shape[0])


_MATRICES: dict[str, Any] = {"float32": Float32Matrix, "bfloat16": BFloat16Matrix, "int8": Int8Matrix}
_MATRICES.update(block_matrices.MATRICES)  # a GGUF file's own blocks (chat.models.block_matrices): built from layers


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
    """What :func:`install` changed in one model, so that :meth:`stock` can undo it for a while."""

    model: nn.Module  # the transformers model (or a multimodal model's text stack)
    weights: str  # the weight format of its linear layers
    replaced: list[tuple[nn.Module, str, nn.Linear | None, FastLinear]] = field(default_factory=list)  # (parent,
    # name, stock layer (None once dropped: non-float32 formats), its replacement) for every rewritten layer
    kernels: dict[tuple[int, int], Kernels] = field(default_factory=dict)  # float32 weight shape -> kernels
    attention: list[tuple[Any, Any]] = field(default_factory=list)  # (decoder config, its attention implementation
    # as loaded): switched to chat.models.ragged's
    smoothed: int = 0  # linear inputs smoothed before int8 quantization (chat.models.smoothing)
    norms: list[tuple[nn.Module, str, nn.Module, FastRMSNorm]] = field(default_factory=list)  # (parent, name,
    # stock norm, its replacement)

    @property
    def fused_names(self) -> list[str]:
        """Dotted names of the fused layers (for tests and reports)."""
        names = {id(m): n for n, m in self.model.named_modules()}
        return [f"{names[id(p)]}.{n}".lstrip(".") for p, n, _, layer in self.replaced if isinstance(layer, FusedPart)]

    @contextlib.contextmanager
    def stock(self) -> Iterator[nn.Module]:
        """The model as loaded while the block runs: its own ``nn.Linear`` layers (the same parameters, row-major as
        loaded) and its own attention implementation. Nothing is copied.

        Raises:
            RuntimeError: the weights are not float32 (the loaded layers were dropped to save memory).
        """
        if self.weights != "float32":
            raise RuntimeError(f"the stock model is kept only with float32 weights, not {self.weights}")
        for parent, name, original, _ in [*self.replaced, *self.norms]:
            setattr(parent, name, original)
        for config, original in self.attention:
            config._attn_implementation_internal = original
        try:
            yield self.model
        finally:
            for config, _ in self.attention:
                config._attn_implementation_internal = ragged.RAGGED_ATTENTION
            for parent, name, _, layer in [*self.replaced, *self.norms]:
                setattr(parent, name, layer)


def install(
    model: nn.Module,
    weights: str = "float32",
    *,
    calibrate_kernels: bool = True,
    calibration: list[int] | None = None,
) -> Patches:
    """Rewrite ``model`` in place (see the module docstring) and return what was done. Without
    ``calibrate_kernels`` every float32 shape keeps :class:`Kernels`' defaults (for tests). For int8, token ids in
    ``calibration`` smooth the activations first (:mod:`chat.models.smoothing`).

    Raises:
        ValueError: ``weights`` is not one of :data:`WEIGHT_FORMATS`.
    """
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    patches = Patches(model, weights)
    native.kernels()  # built (once per machine) or loaded now, at load time, rather than by the first request
    make = _MATRICES[weights]
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
        patches.kernels[shape] = calibrate(tensors) if timed else Kernels()
    for m in matrices:
        m.kernels = patches.kernels[tuple(m.weight.shape)]
    for *_, layer in patches.replaced:  # a fused part's matrix shares its kernels with the fused group's
        if isinstance(layer, FusedPart):
            layer.matrix.kernels = layer._group.matrix.kernels


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
