"""turncache's own decoder forward, for the families whose every layer is attention: Llama (and SmolLM), Qwen2,
Qwen3, Mistral, Gemma 2 and Gemma 3 (text), full and sliding-window attention.

Model differences are data: one :class:`Family` row per ``model_type`` (:data:`FAMILIES`) and the sizes read from
the config into :class:`DecoderArgs`; a checkpoint's or a GGUF file's weight names are mapped in one place
(:mod:`chat.models.decoder.names`), and q/k/v and gate/up are fused into one matrix each as the weights load
(:func:`fused_weights`). Every linear layer is a
weight matrix of :mod:`chat.models.kernels.matrices` (any object with its interface: ``m(x)``, ``m.rows(lo, hi)``,
``m.fuse_rows``), and attention is a kernel called by name (:mod:`chat.models.attention`: ``"native"`` or
``"torch"``). Transformers stays for tokenizers, chat templates, configs (a GGUF file's too, from its metadata),
reading the weights of what the decoder does not read itself (a model directory's safetensors checkpoint and a GGUF
file are read without it: :mod:`chat.models.decoder.checkpoint_weights`, :mod:`chat.models.decoder.gguf_weights`),
and as the oracle in tests; hybrid recurrent and multimodal models keep its forward
(:class:`chat.models.adapter.TransformersAdapter`: their mixers, encoders and 3-D positions are its code, not ported
here).

The step batch (:class:`chat.models.attention.StepBatch`) is every sequence's new tokens laid end to end in one row
of ``T`` tokens, no padding::

    tokens     [T]    int64   token ids: sequence 0's, then sequence 1's, ...
    positions  [T]    int64   each token's position in its own sequence
    seqs       one SeqSlice per sequence: its token range [start, end) in the T tokens, the position of its first
               token, and its K/V rows (one kv_rows.AttentionRows per layer: where its earlier tokens' K/V lie)
    keep       [K]    int64   the tokens whose logits are wanted, in output order

Norms, linear layers, rotary positions and the MLP work token by token over all ``T`` tokens at once; only attention
looks at ``seqs``: each sequence's new K/V go to its own rows, and each of its query tokens attends to its own
sequence's rows (causal, within the layer's window).

One decode step of two conversations walked through (SmolLM2: 30 layers, 9 query heads and 3 K/V heads of 64):
A has 57 tokens, B 12; each feeds one new token. ``tokens = [a57, b12]``, ``positions = [57, 12]``,
``seqs = [SeqSlice(0, 1, 57, A's rows), SeqSlice(1, 2, 12, B's rows)]``, ``keep = [0, 1]``.

1. ``x = embed(tokens)``: ``[2, 576]`` (Gemma scales it by sqrt(hidden)). The rotary tables give ``cos`` / ``sin``
   ``[2, 64]`` for positions 57 and 12 (looked up, computed once per block of positions).
2. Per layer: ``h = norm(x)``; ``q, k, v = qkv(h)``: one matrix product ``[2, 576] -> [2, 576 + 192 + 192]``
   sliced into ``[2, 9, 64]``, ``[2, 3, 64]``, ``[2, 3, 64]`` (Qwen3 / Gemma 3 normalize q and k per head here);
   q and k rotate by their positions (q also takes the attention scale); attention: the native kernel reserves row
   57 of A's buffer and row 12 of B's (``AttentionRows.reserve_row``), writes k and v there, and attends A's query
   to A's rows 0..57 and B's to B's rows 0..12 in one call (a sliding layer's rows start W - 1 rows back); then
   ``x = x + o(attn)`` and ``x = x + down(act(gate) * up)`` with ``gate, up = gate_up(norm(x))`` (Gemma adds a norm
   after each of the two).
3. ``logits = head(norm(x[keep]))``: ``[2, 49152]`` (Gemma 2 soft-caps them). A and B now hold 58 and 13 tokens.

A sequence's token never meets another sequence's: linear layers and norms act per token (int8 products are exact
per token), and attention reads only the sequence's rows, so a sequence computed in a batch gives what it gives
alone. With int8 weights and the native attention kernel, which computes each query token the same way in any call,
a position's logits do not depend on how its prompt was cut into chunks either: a turn from the cache is bit for bit
the turn computed without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from chat.engine.runtime import StepInterrupted
from chat.models import attention
from chat.models.decoder import names
from chat.models.decoder.names import FUSED
from chat.models.kernels.dense_matrices import Float32Matrix, calibrate
from chat.models.kernels.matrices import MATRICES

ROPE_BLOCK = 4096  # rotary tables are computed in blocks of this many positions, each the same way
DECODER_VERSION = "turncache-decoder-1"  # in the fingerprint of the models it computes: bump when its numbers change


class NotPackable(ValueError):
    """The config is one :mod:`chat.models.decoder.model` does not compute (the transformers forward serves it)."""


# ==================================================================== the args table


@dataclass(frozen=True, slots=True)
class Family:
    """What sets a family apart, beyond the sizes in its config."""

    activation_key: str = "hidden_act"  # the config attribute naming the MLP's activation
    qk_norm: bool = False  # q and k are RMS-normalized per head before the rotation (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # norms scale by (offset + weight): 1.0 for Gemma, whose norm weights start at 0
    sandwich: bool = False  # norms after attention and after the MLP too (Gemma 2 and 3)
    embed_scale: bool = False  # embeddings are multiplied by sqrt(hidden) (Gemma)
    query_scalar: bool = False  # attention scale from `query_pre_attn_scalar` instead of the head size (Gemma)
    softcaps: bool = False  # attention and final logits may be soft-capped (`attn_logit_softcapping`, ...)
    rope_per_layer_type: bool = False  # `rope_parameters` holds one set per layer type (Gemma 3)


FAMILIES: dict[str, Family] = {
    "llama": Family(),  # SmolLM and SmolLM2 are Llamas
    "mistral": Family(),
    "qwen2": Family(),  # q/k/v biases come with the weights
    "qwen3": Family(qk_norm=True),
    "gemma2": Family(
        activation_key="hidden_activation",
        norm_offset=1.0,
        sandwich=True,
        embed_scale=True,
        query_scalar=True,
        softcaps=True,
    ),
    "gemma3_text": Family(
        activation_key="hidden_activation",
        qk_norm=True,
        norm_offset=1.0,
        sandwich=True,
        embed_scale=True,
        query_scalar=True,
        softcaps=True,
        rope_per_layer_type=True,
    ),
}

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True, slots=True)
class Rope:
    """Rotary positions of one kind of layer: ``inv_freq`` per pair of dimensions."""

    kind: str  # "default" | "linear" | "llama3"
    theta: float  # base wavelength
    factor: float = 1.0  # linear / llama3 scaling
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_context: int = 8192  # llama3

    def inv_freq(self, dim: int) -> torch.Tensor:
        """``[dim / 2]`` float32 inverse frequencies (the formulas of the papers that define each kind)."""
        inv = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.kind == "linear":
            return inv / self.factor
        if self.kind == "llama3":
            low_wavelen = self.original_context / self.low_freq_factor
            high_wavelen = self.original_context / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_context / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
            return torch.where(medium, smoothed, scaled)
        return inv


@dataclass(frozen=True, slots=True)
class DecoderArgs:
    """A decoder's shape and habits: everything the forward needs from a config."""

    family: str  # model_type
    vocab_size: int
    hidden: int
    layers: int
    heads: int  # query heads
    kv_heads: int  # K/V heads (heads is a multiple)
    head_dim: int
    intermediate: int  # the MLP's width
    norm_eps: float
    activation: str  # a key of ACTIVATIONS
    windows: tuple[int | None, ...]  # per layer: its sliding window W (a query sees itself and W - 1 before), or None
    ropes: tuple[Rope, ...]  # per layer: its rotary positions
    attn_scale: float  # what q . k is multiplied by
    attn_softcap: float | None  # scores -> tanh(scores / cap) * cap before the softmax (Gemma 2)
    final_softcap: float | None  # likewise for the logits
    spec: Family  # the family's row of FAMILIES

    @property
    def qkv_sizes(self) -> tuple[int, int, int]:
        return self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim

    @property
    def matrix_shapes(self) -> dict[str, tuple[int, int]]:
        """``(out, in)`` of each of a layer's matrices, by its part name."""
        q, kv, _ = self.qkv_sizes
        return {
            "q": (q, self.hidden),
            "k": (kv, self.hidden),
            "v": (kv, self.hidden),
            "o": (self.hidden, q),
            "gate": (self.intermediate, self.hidden),
            "up": (self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
        }


def decoder_args(config: Any) -> DecoderArgs:
    """The args of a transformers text config.

    Raises:
        NotPackable: a family not in :data:`FAMILIES`, or a setting this forward does not compute (rotary scaling
            other than linear / llama3, partial rotation, bidirectional attention, an unknown activation, ...).
    """
    family = str(getattr(config, "model_type", ""))
    spec = FAMILIES.get(family)
    if spec is None:
        raise NotPackable(f"{family!r} is not one of {sorted(FAMILIES)}")
    if getattr(config, "use_bidirectional_attention", False):
        raise NotPackable("bidirectional attention")
    activation = str(getattr(config, spec.activation_key, ""))
    if activation not in ACTIVATIONS:
        raise NotPackable(f"activation {activation!r}")
    heads, hidden = int(config.num_attention_heads), int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    layers = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    layer_types = list(getattr(config, "layer_types", None) or ())
    if not layer_types:  # Llama, Mistral: every layer slides when the config names a window
        layer_types = ["sliding_attention" if window is not None else "full_attention"] * layers
    if len(layer_types) != layers or set(layer_types) - {"full_attention", "sliding_attention"}:
        raise NotPackable(f"layer kinds {sorted(set(layer_types))} over {layers} layers")
    if "sliding_attention" in layer_types and not (isinstance(window, int) and window > 0):
        raise NotPackable(f"sliding layers with a window of {window!r}")
    windows = [int(window) if kind == "sliding_attention" else None for kind in layer_types]
    ropes = tuple(_rope(config, kind if spec.rope_per_layer_type else None) for kind in layer_types)
    scale = float(config.query_pre_attn_scalar) ** -0.5 if spec.query_scalar else head_dim**-0.5
    return DecoderArgs(
        family=family,
        vocab_size=int(config.vocab_size),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        intermediate=int(config.intermediate_size),
        norm_eps=float(config.rms_norm_eps),
        activation=activation,
        windows=tuple(windows),
        ropes=ropes,
        attn_scale=scale,
        attn_softcap=_cap(config, "attn_logit_softcapping") if spec.softcaps else None,
        final_softcap=_cap(config, "final_logit_softcapping") if spec.softcaps else None,
        spec=spec,
    )


def _rope(config: Any, layer_type: str | None) -> Rope:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params.get(layer_type) or {}
    kind = params.get("rope_type", "default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotPackable("partial rotary embeddings")
    theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    if kind == "default":
        return Rope("default", theta)
    if kind == "linear":
        return Rope("linear", theta, factor=float(params["factor"]))
    if kind == "llama3":
        return Rope(
            "llama3",
            theta,
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_context=int(params["original_max_position_embeddings"]),
        )
    raise NotPackable(f"rotary scaling {kind!r}")


def _cap(config: Any, name: str) -> float | None:
    value = getattr(config, name, None)
    return float(value) if value else None


# ==================================================================== weights: fusion


def canonical_weights(state: Mapping[str, Any], args: DecoderArgs) -> dict[str, Any]:
    """Our names for a checkpoint's tensors (:func:`chat.models.decoder.names.from_checkpoint`), fused
    (:func:`fused_weights`).

    Raises:
        NotPackable: a tensor this forward would not use (a name it does not know), or one it needs is missing.
    """
    named, unknown = names.from_checkpoint(state, sandwich=args.spec.sandwich)
    if unknown:
        raise NotPackable(f"unexpected weight {unknown[0]!r}")
    return fused_weights(named, args)


def fused_weights(parts: Mapping[str, Any], args: DecoderArgs) -> dict[str, Any]:
    """Tensors under our names with the parts of each fused matrix (:data:`FUSED`) concatenated along the output
    rows (``layers.{i}.qkv.weight`` = q, k, v; biases likewise; a part without a bias gets zeros when a sibling has
    one). Concatenating rows works for any format whose data is laid out per output row, so block-quantized data
    fuses the same way. The LM head falls back to the embedding (tied weights).

    Raises:
        NotPackable: a tensor it needs is missing.
    """
    named = dict(parts)
    for i in range(args.layers):
        for fused, members in FUSED.items():
            weights = [named.pop(f"layers.{i}.{p}.weight", None) for p in members]
            biases = [named.pop(f"layers.{i}.{p}.bias", None) for p in members]
            if any(w is None for w in weights):
                raise NotPackable(f"layer {i} lacks a part of {fused}")
            named[f"layers.{i}.{fused}.weight"] = _concat_rows(weights)
            if any(b is not None for b in biases):
                named[f"layers.{i}.{fused}.bias"] = torch.cat(
                    [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases, strict=True)]
                )
    named.setdefault("head.weight", named.get("embed"))
    needed = ["embed", "norm", "head.weight"]
    for i in range(args.layers):
        needed += [f"layers.{i}.{n}" for n in ("attn_norm", "mlp_norm", "qkv.weight", "o.weight", "gate_up.weight")]
        needed += [f"layers.{i}.{n}" for n in ("down.weight",)]
        if args.spec.qk_norm:
            needed += [f"layers.{i}.q_norm", f"layers.{i}.k_norm"]
        if args.spec.sandwich:
            needed += [f"layers.{i}.post_attn_norm", f"layers.{i}.post_mlp_norm"]
    missing = [n for n in needed if named.get(n) is None]
    if missing:
        raise NotPackable(f"missing weights {missing[:4]}")
    return named


def _concat_rows(parts: list[Any]) -> Any:
    """The parts' rows one after another. A part on the meta device (a layer that keeps its file's blocks, its
    float weight never made) makes the whole a meta tensor of the fused shape: a block format builds that matrix
    from the modules (``from_layers``), whatever mix of blocks and float weights its parts hold."""
    if any(getattr(p, "is_meta", False) for p in parts) and not all(p.is_meta for p in parts):
        rows = sum(int(p.shape[0]) for p in parts)
        return torch.empty((rows, *parts[0].shape[1:]), dtype=parts[0].dtype, device="meta")
    return torch.cat(parts)


# ==================================================================== the forward


class Block(nn.Module):
    """One decoder layer: attention over each sequence's own rows, then the MLP, each around the residual."""

    def __init__(self, index: int, args: DecoderArgs, weights: Mapping[str, Any], matrices: Mapping[str, Any]) -> None:
        super().__init__()
        at = f"layers.{index}."
        self.index = index  # which layer: its K/V rows are seqs[s].rows[index]
        self.window = args.windows[index]  # sliding window, or None
        self.rope = args.ropes[index]  # its rotary kind (Gemma 3: local or global)
        self.qkv = Fused(matrices[at + "qkv"], args.qkv_sizes)  # h -> q, k, v
        self.o = matrices[at + "o"]
        self.gate_up = Fused(matrices[at + "gate_up"], (args.intermediate, args.intermediate))
        self.down = matrices[at + "down"]
        norm = _Norms(args)
        self.attn_norm = norm(weights[at + "attn_norm"])
        self.mlp_norm = norm(weights[at + "mlp_norm"])
        self.post_attn_norm = norm(weights.get(at + "post_attn_norm"))  # None where the family has none
        self.post_mlp_norm = norm(weights.get(at + "post_mlp_norm"))
        self.q_norm = norm(weights.get(at + "q_norm"))
        self.k_norm = norm(weights.get(at + "k_norm"))
        self.eps = args.norm_eps
        self.shape = (args.heads, args.kv_heads, args.head_dim)
        self.act = ACTIVATIONS[args.activation]
        self.softcap = args.attn_softcap

    def forward(self, x: torch.Tensor, step: attention.StepBatch, rotary: Rotary, kernel: str) -> torch.Tensor:
        """``x`` ``[T, hidden]`` -> ``[T, hidden]``; appends the step's K/V to each sequence's rows of this layer."""
        t = x.shape[0]
        heads, kv_heads, d = self.shape
        q, k, v = self.qkv(_rms(x, self.attn_norm, self.eps))  # [T, H*D], [T, Hk*D], [T, Hk*D]
        q, k, v = q.view(t, heads, d), k.view(t, kv_heads, d), v.view(t, kv_heads, d)
        if self.q_norm is not None:
            q, k = _rms(q, self.q_norm, self.eps), _rms(k, self.k_norm, self.eps)
        q, k = rotary.turn(q, self.rope, scaled=True), rotary.turn(k, self.rope)  # q takes the attention scale
        out = attention.KERNELS[kernel](self.index, q, k, v, step, self.window, self.softcap)  # [T, H, D]
        h = self.o(out.view(t, heads * d))
        if self.post_attn_norm is not None:
            h = _rms(h, self.post_attn_norm, self.eps)
        x = x + h
        gate, up = self.gate_up(_rms(x, self.mlp_norm, self.eps))
        h = self.down(self.act(gate) * up)
        if self.post_mlp_norm is not None:
            h = _rms(h, self.post_mlp_norm, self.eps)
        return x + h


class Decoder(nn.Module):
    """The whole model: embedding, :class:`Block` s, final norm, LM head. Called as
    ``decoder(input_ids=step.tokens, step=step)`` -> logits ``[K, vocab]`` float32 of the step's ``keep`` tokens."""

    def __init__(self, args: DecoderArgs, weights: Mapping[str, Any], matrices: Mapping[str, Any], config: Any) -> None:
        super().__init__()
        self.args = args
        self.config = config  # the transformers config it was built from (its identity; never read by the forward)
        embed = weights["embed"]  # a float tensor [vocab, hidden], or a module that looks rows up (BlockEmbedding)
        self.embed = embed if isinstance(embed, nn.Module) else nn.Embedding.from_pretrained(embed, freeze=True)
        dtype = embed.dtype if isinstance(embed, torch.Tensor) else torch.float32
        self.embed_scale = (  # Gemma: sqrt(hidden), rounded to the embedding's dtype as trained
            torch.tensor(math.sqrt(args.hidden), dtype=dtype) if args.spec.embed_scale else None
        )
        self.layers = nn.ModuleList(Block(i, args, weights, matrices) for i in range(args.layers))
        self.norm = _Norms(args)(weights["norm"])
        self.device = weights["norm"].device  # where it computes
        self.head = matrices["head"]  # [vocab, hidden]
        self.rotary = Rotary(args, device=self.device)
        self.smoothing: dict[str, torch.Tensor] = {}  # int8: matrix -> the factor its input was divided by

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def forward(
        self,
        input_ids: torch.Tensor,
        step: attention.StepBatch,
        kernel: str = "torch",
        interrupt: Callable[[], bool] | None = None,
    ) -> torch.Tensor:
        """``interrupt``: asked before every layer after the first; when it returns True the forward raises
        :class:`~chat.engine.runtime.StepInterrupted` there (the layers done have appended K/V rows: the caller
        rolls them back)."""
        x = self.embed(input_ids)  # [T, hidden]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        self.rotary.at(step.positions)
        for i, layer in enumerate(self.layers):
            if i and interrupt is not None and interrupt():
                raise StepInterrupted(f"stopped before layer {i} of {len(self.layers)}")
            x = layer(x, step, self.rotary, kernel)
        logits = self.head(_rms(x.index_select(0, step.keep), self.norm, self.args.norm_eps))  # [K, vocab]
        cap = self.args.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()


class Fused:
    """One matrix standing for several layers that read the same input (q/k/v, gate/up): called whole (one product,
    one activation quantization in int8) up to the matrix's ``fuse_rows`` input rows, by parts above (MKL's float32
    GEMMs over many rows were ~20% slower on the fused matrices); the parts' outputs either way."""

    def __init__(self, matrix: Any, sizes: tuple[int, ...]) -> None:
        self.matrix = matrix  # [sum(sizes), in]
        bounds, lo = [], 0
        for n in sizes:
            bounds.append((lo, lo + n))
            lo += n
        self.bounds = bounds  # part i: output channels [lo, hi)
        self.parts = [matrix.rows(a, b) for a, b in bounds]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if x.shape[0] <= self.matrix.fuse_rows:
            y = self.matrix(x)
            return [y[:, a:b] for a, b in self.bounds]
        return [part(x) for part in self.parts]


class _Norms:
    """Makes the norm weights of one model: ``weight`` as is, or ``1 + weight`` for Gemma (float32, contiguous)."""

    def __init__(self, args: DecoderArgs) -> None:
        self.offset = args.spec.norm_offset

    def __call__(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        if weight is None:
            return None
        return (weight.float() + self.offset).contiguous() if self.offset else weight.float().contiguous()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


class Rotary:
    """Rotary positions: ``cos`` / ``sin`` tables per kind of layer, grown by blocks of :data:`ROPE_BLOCK` positions
    (each block computed the same way, so a position's values never depend on what else was computed), and the
    rotation of q and k (the halves layout: ``x * cos + rotate_half(x) * sin``)."""

    def __init__(self, args: DecoderArgs, device: torch.device) -> None:
        self.half = args.head_dim // 2
        self.scale = args.attn_scale
        self.device = device
        self.inv_freq = {rope: rope.inv_freq(args.head_dim).to(device) for rope in set(args.ropes)}  # [D / 2]
        self.tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]] = {}  # rope -> cos, sin [positions, D / 2]
        self.step: dict[tuple[Rope, bool], tuple[torch.Tensor, torch.Tensor]] = {}  # this step's (cos, sin) rows

    def at(self, positions: torch.Tensor) -> None:
        """Look up the step's rows: per kind, ``[T, 1, D]`` ``cos`` and signed ``sin`` (and scaled copies for q)."""
        self.step.clear()
        top = int(positions.max()) + 1 if positions.numel() else 0
        for rope in self.inv_freq:
            cos, sin = self._table(rope, top)
            c, s = cos.index_select(0, positions), sin.index_select(0, positions)  # [T, D / 2]
            full_cos = torch.cat((c, c), dim=-1).unsqueeze(1)  # [T, 1, D]
            signed_sin = torch.cat((-s, s), dim=-1).unsqueeze(1)
            self.step[(rope, False)] = full_cos, signed_sin
            self.step[(rope, True)] = full_cos * self.scale, signed_sin * self.scale

    def turn(self, x: torch.Tensor, rope: Rope, scaled: bool = False) -> torch.Tensor:
        """``x`` ``[T, n, D]`` rotated by each token's position (times the attention scale if ``scaled``)."""
        cos, sin = self.step[(rope, scaled)]
        return x * cos + x.roll(self.half, dims=-1) * sin  # roll: [x2, x1]; sin: [-s, s] -> [-x2 s, x1 s]

    def _table(self, rope: Rope, top: int) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.tables.get(rope, (None, None))
        held = 0 if cos is None else cos.shape[0]
        if held >= top:
            assert cos is not None and sin is not None
            return cos, sin
        blocks_cos, blocks_sin = [] if cos is None else [cos], [] if sin is None else [sin]
        for start in range(held, top, ROPE_BLOCK):
            at = torch.arange(start, start + ROPE_BLOCK, device=self.device).float()
            freqs = at[:, None] * self.inv_freq[rope][None, :]  # [ROPE_BLOCK, D / 2]
            blocks_cos.append(freqs.cos())
            blocks_sin.append(freqs.sin())
        table = torch.cat(blocks_cos), torch.cat(blocks_sin)
        self.tables[rope] = table
        return table


# ==================================================================== building one


MatrixMaker = Callable[[str, Any, "torch.Tensor | None"], Any]  # (our name, weight, bias) -> a matrix
MATRIX_NAMES = ("qkv", "o", "gate_up", "down")  # per layer; and "head"


def build_decoder(
    config: Any,
    state: Mapping[str, Any],
    weights: str,
    *,
    calibration: list[int] | None = None,
    layers: Mapping[str, Sequence[Any]] | None = None,
    time_blas: bool = True,
    embedding: Any = None,
    names_of: str = "checkpoint",
) -> Decoder:
    """A :class:`Decoder` for a transformers config and state dict, its linear layers in the weight format
    ``weights`` (a key of :data:`chat.models.kernels.matrices.MATRICES`). A format is a class built from a float weight
    and bias (``cls(weight, bias)``; a fused matrix from its parts' rows concatenated), or an object with
    ``from_layers(modules)``, which is given the checkpoint's own linear modules of each matrix, in output order
    (``layers``: :func:`linear_modules`), for formats whose data the modules hold (a GGUF file's blocks). float32
    matrices share the state's tensors. For int8, ``calibration`` token ids first move activation outliers into the
    weights (:func:`chat.models.smoothing.smooth_decoder`). ``time_blas``: time the float32 BLAS forms per weight
    shape (:func:`chat.models.kernels.matrices.calibrate`), else keep their defaults. ``embedding``: the input
    embedding's file blocks (a :class:`chat.models.kernels.block_matrices.BlockWeight`, from a GGUF file): in every
    format but float32 (whose tied head shares the float32 table) the lookups read those (:class:`BlockEmbedding`: the
    same values) and the float32 table is not kept. ``names_of``: ``"checkpoint"`` (``state`` is a checkpoint's
    state dict, named as :data:`chat.models.decoder.names.CHECKPOINT_NAMES` names it) or ``"decoder"`` (``state`` is
    under our names already, its matrices not yet fused: a GGUF file's, :mod:`chat.models.decoder.gguf_weights`).

    Raises:
        NotPackable: the config or the weights are not what this forward computes.
        ValueError: ``weights`` is no known format, or one built from modules without ``layers``.
    """
    if weights not in MATRICES:
        raise ValueError(f"weight format {weights!r} is not one of {', '.join(MATRICES)}")
    fmt = MATRICES[weights]
    args = decoder_args(config)
    named = canonical_weights(state, args) if names_of == "checkpoint" else fused_weights(state, args)
    named["embed"] = named["embed"].float()  # activations are float32 whatever the weights (a copy if bfloat16)
    smoothing: dict[str, torch.Tensor] = {}
    if hasattr(fmt, "from_layers"):
        if layers is None:
            raise ValueError(f"the {weights} format is built from the checkpoint's modules: pass layers")
        matrices = {name: fmt.from_layers(list(modules)) for name, modules in layers.items()}
    else:
        if weights == "int8" and calibration and not args.spec.norm_offset:
            from chat.models.smoothing import smooth_decoder

            draft = Decoder(args, named, _matrices(named, args, _float32, time_blas=False), config)
            named = smooth_decoder(draft, named, calibration, factors=smoothing)
        maker = _maker(fmt)
        matrices = _matrices(named, args, maker, time_blas=time_blas and weights == "float32")
    if weights != "float32":  # only the format's copies stay: the float tensors go
        if embedding is not None and named["embed"].device.type == "cpu":
            from chat.models.kernels.block_matrices import BlockEmbedding, BlockMatrix

            head = matrices["head"]
            tied = layers is not None and getattr(layers["head"][0], "block_weight", None) is embedding
            shared = tied and isinstance(head, BlockMatrix) and head.packed is not None and head.columns is None
            named["embed"] = BlockEmbedding(head if shared else embedding)  # the lookups read the file's blocks
        named = {name: _own(t) for name, t in named.items() if name in _KEPT or _kept(name)}
    decoder = Decoder(args, named, matrices, config)
    decoder.smoothing = smoothing  # a LoRA adapter's products take the same factors (chat.models.decoder.lora)
    return decoder


def linear_modules(model: nn.Module, args: DecoderArgs) -> dict[str, list[nn.Module]]:
    """The linear modules of a transformers model behind each of our matrices (``layers.{i}.qkv`` -> its q, k and v
    projections, ...; ``head`` -> the LM head), found through :data:`chat.models.decoder.names.CHECKPOINT_NAMES`.

    Raises:
        NotPackable: a module is missing.
    """
    modules = dict(model.named_modules())
    out: dict[str, list[nn.Module]] = {}
    for i in range(args.layers):
        for name in MATRIX_NAMES:
            parts = FUSED.get(name, (name,))
            found = [modules.get(names.checkpoint_module(f"layers.{i}.{p}")) for p in parts]
            if any(m is None for m in found):
                raise NotPackable(f"layer {i} lacks a module of {name}")
            out[f"layers.{i}.{name}"] = found
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise NotPackable("no LM head module")
    out["head"] = [head]
    return out


_KEPT = ("embed", "norm")


def _kept(name: str) -> bool:
    return name.endswith("norm")


def _own(tensor: Any) -> Any:
    """A copy of its own of a tensor that stays (embedding, norms): the loaded checkpoint's memory, which a view
    would keep resident whole, can then go (a module, a block embedding, holds its own already)."""
    return tensor if isinstance(tensor, nn.Module) else tensor.detach().clone()


def _float32(name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Float32Matrix:
    return Float32Matrix(weight.detach().float(), None if bias is None else bias.detach().float())


def _maker(cls: Any) -> MatrixMaker:
    def make(name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        return cls(weight.detach().float(), None if bias is None else bias.detach().float())

    return make


def _matrices(named: Mapping[str, Any], args: DecoderArgs, make: MatrixMaker, *, time_blas: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(args.layers):
        for part in MATRIX_NAMES:
            name = f"layers.{i}.{part}"
            out[name] = make(name, named[name + ".weight"], named.get(name + ".bias"))
    out["head"] = make("head", named["head.weight"], named.get("head.bias"))
    float32 = [m for m in out.values() if isinstance(m, Float32Matrix)]
    by_shape: dict[tuple[int, ...], list[Float32Matrix]] = {}
    for m in float32:
        by_shape.setdefault(tuple(m.weight.shape), []).append(m)
    for group in by_shape.values():
        forms = calibrate([m.weight for m in group]) if time_blas else group[0].forms
        for m in group:
            m.forms = forms
    return out
