"""Faster decoding on CPU for a loaded transformers model, computing the same function (up to float rounding).

Decoding is bound by reading the weights: each step multiplies one row of activations (or a few: draft tokens being
verified) by every weight matrix, and on this CPU (MKL, AVX2) the speed of that product depends far more on which
BLAS call does it than on the number of rows. Measured on SmolLM2's shapes, 2 threads: ``F.linear`` with 2-16 rows
is 1.5-3x slower than ``torch.mm(weight, x.T)`` on the same row-major weight, and 5 rows that way cost about what
one row costs through ``F.linear``. Three rewrites, each applied only where it fits, all undone while
:meth:`FastPaths.stock` is held (a baseline must measure the stock model)::

    fast = FastPaths.apply(model)   # once, after loading (the adapter does it)
    with fast.stock() as model:     # the model exactly as loaded: its own layers and attention function
        model.generate(...)

- **Linear kernels.** Every plain float32 ``nn.Linear`` becomes a :class:`FastLinear` holding the same parameters
  (nothing is copied or re-laid: the weights stay row-major, so memory, embeddings tied to an output projection and
  prefill are unaffected). For 1 row and for 2-:data:`FEW_ROWS` rows it runs the faster of two BLAS forms for its
  weight shape, chosen once per shape by timing both on the model's own weights (:func:`calibrate`): one row by
  ``F.linear`` (a GEMV) or as a two-row ``torch.mm`` (a GEMM, faster with 2 threads), a few rows by ``F.linear`` or
  ``torch.mm(weight, x.T)``. More rows (prefill) always go to ``F.linear``.
- **Fused projections.** Sibling ``q_proj`` / ``k_proj`` / ``v_proj`` (and ``gate_proj`` / ``up_proj``) layers that
  read the same input become :class:`FusedPart` modules over one ``[sum of outs, in]`` matrix: for up to
  :data:`FEW_ROWS` rows the first of a group computes every part in one call and keeps the result, the others take
  their slice when called with the same input tensor (and compute their own slice otherwise, e.g. in
  cross-attention). Longer inputs (prefill) run each part on its own slice of the matrix: MKL's GEMMs over 256 rows
  were ~20% slower on the fused matrices. The parts' weights become row slices
  (views) of the fused matrix, so memory does not grow and the stock layers read the same values row-major.
- **Short-query attention.** Decoder attention configured as ``"sdpa"`` is switched to :data:`ATTENTION_NAME`,
  registered in transformers' ``AttentionInterface`` (and, with SDPA's mask builder, in its mask interface). For up
  to :data:`SHORT_QUERY` query tokens it computes grouped-query attention as two batched matmuls with a softmax
  between them, the queries of a K/V head group stacked as rows (no ``repeat_kv``); anything else (longer queries,
  bf16, dropout, soft-capping, position biases, a paged cache) goes to transformers' own SDPA function, which
  ignores the same other arguments.

Only float32 layers are rewritten (the kernels were measured for MKL's float32 routines; bfloat16 goes through
oneDNN). The rewrites apply to the module given (the adapter gives a multimodal model's text stack, so vision and
audio encoders keep theirs); recurrent mixers and normalisations are left as they are. Not thread-safe.
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
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "turncache_short_query"  # our entry in transformers' attention and mask interfaces
SHORT_QUERY = 16  # most query tokens the matmul attention handles; longer queries go to SDPA
FEW_ROWS = 16  # most rows (tokens) a linear layer runs with its calibrated few-rows kernel
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # sibling layers fused, in output order
# keyword arguments that SDPA's function acts on (it ignores all others, and so does the matmul attention): with any
# of them set, the call goes to SDPA
_SDPA_OPTIONS = ("softcap", "position_bias", "cache", "output_attentions")
_CALIBRATION_ROWS = 5  # rows the few-rows kernels are timed with (a verification of 4 draft tokens)
_CALIBRATION_ROUNDS = 5  # interleaved timing rounds per shape; the fastest round counts


# ==================================================================== linear layers


@dataclass(slots=True)
class Kernels:
    """Which BLAS form a weight shape runs with (see the module docstring)."""

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


class FastLinear(nn.Module):
    """An ``nn.Linear`` (same parameters, same result up to rounding) that runs :func:`linear`."""

    def __init__(self, original: nn.Linear, kernels: Kernels) -> None:
        super().__init__()
        self.weight = original.weight  # the same parameter objects: ties and the state dict are unchanged
        self.bias = original.bias
        self.in_features, self.out_features = original.in_features, original.out_features
        self.kernels = kernels  # shared by every layer of this weight shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.kernels)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernels={self.kernels}"


class _FusedMatrix:
    """The shared state of one group of fused layers (not a module: the state dict never sees it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bounds: list[tuple[int, int]]) -> None:
        self.weight = weight  # [sum of outs, in], row-major; the parts' weights are views of its rows
        self.bias = bias  # [sum of outs] or None
        self.bounds = bounds  # part i's outputs: columns [lo, hi) of the fused result
        self.kernels = Kernels()  # for the fused shape; set by calibration
        self.input: torch.Tensor | None = None  # what the first part was last called with
        self.output: torch.Tensor | None = None  # every part's result for `input`, until all parts took theirs
        self.pending = 0  # parts still to take their slice of `output`


class FusedPart(FastLinear):
    """One layer of a fused group; computes ``F.linear(x, weight, bias)`` like the ``nn.Linear`` it replaces."""

    def __init__(self, original: nn.Linear, kernels: Kernels, fused: _FusedMatrix, index: int) -> None:
        super().__init__(original, kernels)
        self.index = index  # position in the group
        self._fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self._fused
        if x.numel() > FEW_ROWS * x.shape[-1]:  # prefill: MKL's GEMMs are faster on the separate matrices
            return linear(x, self.weight, self.bias, self.kernels)
        if self.index == 0:  # the group's first layer: every part at once
            f.input, f.output, f.pending = x, linear(x, f.weight, f.bias, f.kernels), len(f.bounds) - 1
        elif x is not f.input or f.output is None:  # another input: this part alone
            f.input = f.output = None
            return linear(x, self.weight, self.bias, self.kernels)
        lo, hi = f.bounds[self.index]
        out = f.output[..., lo:hi].contiguous()
        if self.index:
            f.pending -= 1
            if f.pending == 0:
                f.input = f.output = None
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, part={self.index} of {len(self._fused.bounds)}"


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


# ==================================================================== attention


def short_query_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: ``query [B, H, q, D]``, ``key``/``value [B, Hk, L, D]`` ->
    ``(out [B, q, H, Dv], None)``, equal to :func:`sdpa_attention_forward` up to float rounding.

    Matmul attention when ``q <= SHORT_QUERY`` and either ``q == 1`` or a mask is given (with ``q > 1`` and no mask
    SDPA applies its own causal rule); SDPA otherwise.
    """
    b, h, q, d = query.shape
    hk = key.shape[1]
    simple = (
        q <= SHORT_QUERY
        and (q == 1 or attention_mask is not None)
        and query.dtype == key.dtype == value.dtype == torch.float32
        and not dropout
        and h % hk == 0
        and key.shape[0] == b
        and all(kwargs.get(k) is None or kwargs.get(k) is False for k in _SDPA_OPTIONS)
        and (attention_mask is None or attention_mask.dim() == 4)
    )
    if not simple:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    g = h // hk  # query heads per K/V head
    scale = d**-0.5 if scaling is None else scaling
    rows = query.reshape(b, hk, g * q, d)  # head hk*g + j, token t -> row j*q + t of group hk
    scores = torch.matmul(rows, key.transpose(-1, -2))  # [B, Hk, g*q, L]
    scores.mul_(scale)
    if attention_mask is not None:
        _mask_(scores.view(b, hk, g, q, -1), attention_mask, hk, g)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value)  # [B, Hk, g*q, Dv]
    return out.view(b, h, q, -1).transpose(1, 2).contiguous(), None


def _mask_(scores: torch.Tensor, mask: torch.Tensor, hk: int, g: int) -> None:
    """Apply a boolean (True = attend) or additive ``mask [B or 1, 1 or H, q, L]`` to ``scores [B, Hk, g, q, L]``."""
    mb, mh, mq, ml = mask.shape
    m = mask.unsqueeze(2) if mh == 1 else mask.reshape(mb, hk, g, mq, ml)  # broadcast over Hk and g
    if mask.dtype == torch.bool:
        scores.masked_fill_(~m, float("-inf"))
    else:
        scores.add_(m)


def _register_attention() -> None:
    if ATTENTION_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION_NAME, short_query_attention)
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


# ==================================================================== the rewrite


@dataclass(eq=False)
class FastPaths:
    """What :meth:`apply` changed in one model, so that :meth:`stock` can undo it for a while."""

    model: nn.Module  # the transformers model (or a multimodal model's text stack)
    replaced: list[tuple[nn.Module, str, nn.Linear, FastLinear]] = field(default_factory=list)  # (parent, name,
    # stock layer, its replacement) for every rewritten layer
    kernels: dict[tuple[int, int], Kernels] = field(default_factory=dict)  # weight shape -> calibrated kernels
    attention: list[Any] = field(default_factory=list)  # configs switched from "sdpa" to ATTENTION_NAME

    @classmethod
    def apply(cls, model: nn.Module, *, calibrate_kernels: bool = True) -> FastPaths:
        """Rewrite ``model`` in place (see the module docstring) and return what was done. Without
        ``calibrate_kernels`` every shape keeps :class:`Kernels`' defaults (for tests)."""
        fast = cls(model)
        fused: list[_FusedMatrix] = []
        with torch.inference_mode(False), torch.no_grad():
            fast._fuse(fused)
            fast._wrap_others()
        by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
        for f in fused:
            by_shape.setdefault(tuple(f.weight.shape), []).append(f.weight)
        for _, _, _, layer in fast.replaced:
            by_shape.setdefault(tuple(layer.weight.shape), []).append(layer.weight)
        for shape, weights in by_shape.items():
            fast.kernels[shape] = calibrate(weights) if calibrate_kernels else Kernels()
        for f in fused:
            f.kernels = fast.kernels[tuple(f.weight.shape)]
        for _, _, _, layer in fast.replaced:
            layer.kernels = fast.kernels[tuple(layer.weight.shape)]
        for config in _decoder_configs(model):
            if getattr(config, "_attn_implementation_internal", None) == "sdpa":
                _register_attention()
                config._attn_implementation_internal = ATTENTION_NAME
                fast.attention.append(config)
        return fast

    @property
    def fused_names(self) -> list[str]:
        """Dotted names of the fused layers (for tests and reports)."""
        names = {id(m): n for n, m in self.model.named_modules()}
        return [f"{names[id(p)]}.{n}".lstrip(".") for p, n, _, layer in self.replaced if isinstance(layer, FusedPart)]

    @contextlib.contextmanager
    def stock(self) -> Iterator[nn.Module]:
        """The model as loaded while the block runs: its own ``nn.Linear`` layers (holding the same parameters,
        row-major as loaded) and its own attention implementation. Nothing is copied."""
        for parent, name, original, _ in self.replaced:
            setattr(parent, name, original)
        for config in self.attention:
            config._attn_implementation_internal = "sdpa"
        try:
            yield self.model
        finally:
            for config in self.attention:
                config._attn_implementation_internal = ATTENTION_NAME
            for parent, name, _, layer in self.replaced:
                setattr(parent, name, layer)

    # ---------------------------------------------------------------- internals

    def _fuse(self, fused: list[_FusedMatrix]) -> None:
        """Replace each group of :data:`FUSED_GROUPS` siblings by :class:`FusedPart` modules over one matrix."""
        shared = _shared_parameters(self.model)
        for parent in list(self.model.modules()):
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
                matrix = _FusedMatrix(weight, bias, bounds)
                for i, (name, m) in enumerate(zip(names, layers, strict=True)):
                    m.weight.data = weight[bounds[i][0] : bounds[i][1]]  # a view: the values are held once
                    if bias is not None:
                        m.bias.data = bias[bounds[i][0] : bounds[i][1]]
                    part = FusedPart(m, Kernels(), matrix, i)
                    setattr(parent, name, part)
                    self.replaced.append((parent, name, m, part))
                fused.append(matrix)

    def _wrap_others(self) -> None:
        """Every other plain float32 ``nn.Linear`` becomes a :class:`FastLinear`."""
        for parent in list(self.model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.dim() == 2:
                    layer = FastLinear(child, Kernels())
                    setattr(parent, name, layer)
                    self.replaced.append((parent, name, child, layer))


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
