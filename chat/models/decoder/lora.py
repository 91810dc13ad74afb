"""LoRA adapters on turncache's own decoder: loaded by name, known by what they are, computed together.

**Identity.** A :class:`LoraAdapter` is known to the cache by :attr:`LoraAdapter.identity`: a digest of every
module's name, shapes, scaling (the adapter's ``lora_alpha`` rule times the scale it was loaded with) and the bytes
of its ``A`` and ``B`` weights. Its name never enters the cache: the turn's namespace gets the tagged component
``("lora", identity)`` (:data:`NAMESPACE_TAG`, see cache/DESIGN.md), so two names for the same weights share
prefixes, and a name loaded again with other weights starts a new namespace.

**Batched forward** (S-LoRA / Punica style). :class:`AdapterBank` wraps each decoder layer's four products (q/k/v,
o, gate/up, down) once, on the first forward that holds an adapter; the base products run as before over all ``T``
tokens of the step, and each row's own adapter's update ``scale * (x A^T) B^T`` is added to its output (rows of the
base model get nothing added). An adapter's parts of a group are one product each way: their ``A`` stacked
``[r total, in]``, their ``B`` block-diagonal ``[group out, r total]``, scaling folded in. The step's row adapter
index picks the work:

- a long step (more than :data:`STACKED_ROWS` rows: prefill chunks): for each adapter present, its rows are gathered
  (a view when they are one run), multiplied by its ``A`` and ``B``, and added back (``index_add_``);
- a short step (decode: a few rows of many adapters): every resident adapter at once, so that its cost does not grow
  with the number of adapters: one ``A`` product over all their columns, masked to each row's own adapter's columns,
  one ``B`` product block-diagonal over the adapters (``[T, slots, out]``), each row's own block picked.

Both give a row the same numbers (below), so how a prompt is cut into steps never shows in its logits. One forward
serves any mix of adapters and the base.

**Numbers.** Float32 and bfloat16 weights: the low-rank products run in float32 (a turn under an adapter equals the
model with the adapter merged into its weights within float32 rounding). int8 and the GGUF block formats, whose
cache hits are bit for bit the turn computed without the cache, run them as int8 products too
(:class:`chat.models.kernels.dense_matrices.Int8Matrix`: each token's result depends on that token alone, whatever the
batch or the prefill chunk; weights quantized per output row, so stacking adapters changes no adapter's numbers; the
mask keeps another adapter's columns out of a row's activation scale), on the smoothed activations of an int8 model
(``A``'s columns take the smoothing factors, ``up``'s ``B`` rows their inverse, as the base weights did).

**Residency.** Up to ``max_loras`` adapters are kept in their computing form (moved to the model's device,
quantized for int8); the others stay as read (host memory) and are swapped in when a step needs them, the least
recently used one going out. A step with more adapters than that is split by the runtime into forwards of at most
``max_loras`` adapters each.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from chat.models.errors import AdapterMismatchError, UnknownAdapterError
from chat.models.lora_files import LoraModule, LoraWeights, read_adapter

NAMESPACE_TAG = "lora"  # the tag of an adapter's component in a cache namespace: ("lora", identity)
DEFAULT_MAX_LORAS = 4  # adapters kept in computing form at once (`--max-loras`)
STACKED_ROWS = 32  # steps of at most this many token rows compute every adapter stacked; longer ones per adapter
GROUPS = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}  # wrapped product ->
# the adapter modules it takes, in output order


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """One loaded adapter: the name it was loaded under, where from, its weights as read (host memory) and its
    identity. Immutable: loading a name again makes a new one (turns in flight keep the one they began with)."""

    name: str
    source: str  # the path it was read from
    scale: float  # the scale it was loaded with (already folded into each module's scaling)
    modules: dict[str, LoraModule] = field(repr=False)  # "layers.{i}.{q,k,v,o,gate,up,down}" -> update
    identity: str = ""  # digest of weights and scalings: the cache namespace component

    @property
    def namespace_component(self) -> tuple[str, str]:
        """What a turn under this adapter adds to its cache namespace."""
        return (NAMESPACE_TAG, self.identity)

    @property
    def rank(self) -> int:
        return max(m.a.shape[0] for m in self.modules.values())


def adapter_identity(modules: dict[str, LoraModule]) -> str:
    """A digest of every module's name, shapes, scaling and weights (float32 bytes): equal for equal updates."""
    h = hashlib.blake2b(b"turncache-lora-1\0", digest_size=20)
    for name in sorted(modules):
        m = modules[name]
        h.update(name.encode() + b"\0")
        h.update(struct.pack("<4qd", *m.a.shape, *m.b.shape, float(m.scaling)))
        h.update(m.a.float().contiguous().numpy().tobytes())
        h.update(m.b.float().contiguous().numpy().tobytes())
    return "lora-blake2b:" + h.hexdigest()


def make_adapter(name: str, weights: LoraWeights, scale: float = 1.0) -> LoraAdapter:
    """A :class:`LoraAdapter` of weights read with ``scale`` already applied (:func:`read_adapter`)."""
    return LoraAdapter(name, weights.source, scale, dict(weights.modules), adapter_identity(weights.modules))


def check_fits(modules: dict[str, LoraModule], args: Any) -> None:
    """Refuse an adapter that does not fit a decoder of ``args`` (:class:`chat.models.decoder.model.DecoderArgs`).

    Raises:
        AdapterMismatchError: naming the first module whose layer is not there or whose shapes differ.
    """
    shapes = args.matrix_shapes  # (out, in) of each target
    for name in sorted(modules):
        m = modules[name]
        _, index, target = name.split(".")
        if int(index) >= args.layers:
            raise AdapterMismatchError(name, f"the base model has {args.layers} layers (0..{args.layers - 1})")
        out, inp = shapes[target]
        if m.a.shape[1] != inp or m.b.shape[0] != out or m.a.shape[0] != m.b.shape[1]:
            raise AdapterMismatchError(
                name,
                f"lora_A {tuple(m.a.shape)} and lora_B {tuple(m.b.shape)} do not fit the base model's "
                f"[{out}, {inp}] weight (want A [r, {inp}], B [{out}, r])",
            )


# ==================================================================== computing form


Product = Callable[[torch.Tensor], torch.Tensor]  # x [n, in] -> [n, out]


class _Blocks:
    """One adapter's update of each wrapped group (``layers.{i}.qkv``, ...), ready to stack (host memory, float32):
    its parts' ``A`` one under the other ``[r, in]`` and their ``B`` laid block-diagonally ``[group out, r]`` (zero
    rows for parts it does not change), with its scaling and the model's int8 smoothing folded in."""

    def __init__(self, adapter: LoraAdapter, smoothing: dict[str, torch.Tensor], sizes: dict[str, int]) -> None:
        self.identity = adapter.identity
        self.groups: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        layers = {int(name.split(".")[1]) for name in adapter.modules}
        for i in sorted(layers):
            for group, parts in GROUPS.items():
                key = f"layers.{i}.{group}"
                found = [(j, adapter.modules.get(f"layers.{i}.{part}")) for j, part in enumerate(parts)]
                found = [(j, m) for j, m in found if m is not None]
                if not found:
                    continue
                s_in = smoothing.get(key)  # the group's inputs were divided by this (int8 smoothing)
                s_down = smoothing.get(f"layers.{i}.down") if group == "gate_up" else None  # and up's rows by this
                outs = [sizes[part] for part in parts]
                b_all = torch.zeros(sum(outs), sum(m.a.shape[0] for _, m in found))
                stacked, col = [], 0
                for j, m in found:
                    a = m.a if s_in is None else m.a * s_in.to(m.a.device)
                    b = m.b * m.scaling
                    if parts[j] == "up" and s_down is not None:
                        b = b / s_down.to(b.device).unsqueeze(1)
                    row = sum(outs[:j])
                    b_all[row : row + outs[j], col : col + a.shape[0]] = b
                    stacked.append(a.float())
                    col += a.shape[0]
                self.groups[key] = (torch.cat(stacked), b_all)


@dataclass(frozen=True, slots=True)
class _Group:
    """The resident adapters' updates of one wrapped group, stacked: ``a`` takes the input to every adapter's
    columns ``[n, W]``; ``b`` (block-diagonal over adapters) gives every adapter's update ``[n, slots * out]``."""

    a: Product
    b: Product
    out: int  # the group's output width
    slots: int  # adapters stacked (resident)
    layout: tuple[int, ...]  # columns per slot (which slot each of the W columns belongs to)
    column_slot: torch.Tensor  # [W] int64: the slot of each column


class _Stack:
    """Every resident adapter in computing form, in slots: per wrapped group one ``A`` product over all their
    columns and one block-diagonal ``B`` product (quantized per output row, so that each adapter's numbers never
    depend on which others are stacked), and each adapter's own two products (:attr:`alone`). Both give the same
    numbers for a row (int8: the same bits: the same rows of weights, and a row's activations hold only its own
    adapter's columns either way)."""

    def __init__(self, blocks: list[_Blocks], device: torch.device, int8: bool, outs: dict[str, int]) -> None:
        self.slots = {b.identity: i for i, b in enumerate(blocks)}
        self.groups: dict[str, _Group] = {}
        self.alone: dict[str, dict[int, tuple[Product, Product]]] = {}  # key -> slot -> its own (A, B) products
        keys = sorted({key for b in blocks for key in b.groups})
        n = len(blocks)
        for key in keys:
            out = outs[key.rsplit(".", 1)[1]]
            widths = [b.groups[key][0].shape[0] if key in b.groups else 0 for b in blocks]
            a_all = torch.cat([b.groups[key][0] for b in blocks if key in b.groups])
            b_big = torch.zeros(n * out, sum(widths))
            col = 0
            for slot, (b, width) in enumerate(zip(blocks, widths, strict=True)):
                if width:
                    b_big[slot * out : (slot + 1) * out, col : col + width] = b.groups[key][1]
                    col += width
            column_slot = torch.repeat_interleave(torch.arange(n), torch.tensor(widths)).to(device)
            self.groups[key] = _Group(
                _product(a_all, device, int8), _product(b_big, device, int8), out, n, tuple(widths), column_slot
            )
            self.alone[key] = {
                slot: (_product(b.groups[key][0], device, int8), _product(b.groups[key][1], device, int8))
                for slot, b in enumerate(blocks)
                if key in b.groups
            }


def _product(weight: torch.Tensor, device: torch.device, int8: bool) -> Product:
    """``x -> x @ weight.T``: float32, or an int8 product (:class:`~chat.models.kernels.dense_matrices.Int8Matrix`, its
    native kernel called straight for the float32 rows the wrapped products hand it: a decode step makes ~240 of
    these)."""
    if int8:
        from chat.models.kernels.dense_matrices import Int8Matrix

        matrix = Int8Matrix(weight.float(), None)
        kernels, packed, wsum, step = matrix.kernels, matrix.packed, matrix.wsum, matrix._step
        if kernels is None or packed is None or wsum is None:
            return matrix

        def int8(x: torch.Tensor) -> torch.Tensor:
            if x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1:
                return kernels.int8_linear(x, packed, wsum, step, None)
            return matrix(x)

        return int8
    w = weight.float().to(device).contiguous()
    return lambda x: torch.mm(x, w.t())


class LoraStep:
    """The forward now running: the stack, each token row's slot (``-1``: the base model), and how the update is
    computed: stacked (a few rows, a decode step: the same few products whatever the number of adapters), or per
    adapter on its gathered rows (many rows: a prefill chunk, where the stacked ``B`` would compute every adapter's
    update for every row). ``stack`` None: no adapter in this step."""

    def __init__(self) -> None:
        self.stack: _Stack | None = None
        self.row_slot: torch.Tensor | None = None  # [T] int64
        self.stacked = True
        self._pick: torch.Tensor | None = None  # [T]: row t's own block in the [T * slots, out] stacked update
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}
        self._rows: list[tuple[int, torch.Tensor, tuple[int, int] | None]] = []  # per slot present: its rows

    def set(self, stack: _Stack | None, slots: list[int] | None, device: torch.device | None = None) -> None:
        self.stack, self._masks, self._rows, self.row_slot, self._pick = stack, {}, [], None, None
        if stack is None or slots is None:
            return
        self.stacked = len(slots) <= STACKED_ROWS
        if self.stacked:
            self.row_slot = torch.tensor(slots, dtype=torch.int64, device=device)
            n = len(stack.slots)
            self._pick = torch.tensor([t * n + max(slot, 0) for t, slot in enumerate(slots)], device=device)
            return
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(row)
        for slot, at in by_slot.items():
            span = (at[0], at[-1] + 1) if at[-1] + 1 - at[0] == len(at) else None
            self._rows.append((slot, torch.tensor(at, dtype=torch.int64, device=device), span))

    def add(self, key: str, x: torch.Tensor, y: torch.Tensor, bounds: Sequence[tuple[int, int]] | None = None) -> None:
        """Add each row's own adapter's update of group ``key`` to ``y`` (``[T, out]``, or the group's parts:
        ``y`` a list and ``bounds`` their columns)."""
        assert self.stack is not None
        if self.stacked:
            group = self.stack.groups[key]
            delta = self._stacked(group, x)
            if bounds is None:
                y.add_(delta)
            else:
                for (lo, hi), part in zip(bounds, y, strict=True):
                    part.add_(delta[:, lo:hi])
            return
        own = self.stack.alone[key]
        for slot, index, span in self._rows:
            products = own.get(slot)
            if products is None:
                continue
            a, b = products
            xs = x[span[0] : span[1]] if span is not None else x.index_select(0, index)
            delta = b(a(xs))
            targets = (
                [(y, 0, delta.shape[1])]
                if bounds is None
                else [(p, lo, hi) for (lo, hi), p in zip(bounds, y, strict=True)]
            )
            for target, lo, hi in targets:
                if span is not None:
                    target[span[0] : span[1]] += delta[:, lo:hi]
                else:
                    target.index_add_(0, index, delta[:, lo:hi])

    def _stacked(self, group: _Group, x: torch.Tensor) -> torch.Tensor:
        """``[T, out]``: each row's own adapter's update of this group (exact zeros for base rows)."""
        assert self.row_slot is not None and self._pick is not None
        mask = self._masks.get(group.layout)
        if mask is None:
            mask = (group.column_slot.unsqueeze(0) == self.row_slot.unsqueeze(1)).to(x.dtype)  # [T, W]
            self._masks[group.layout] = mask
        xa = group.a(x).mul_(mask)  # every adapter's columns, then only the row's own: its numbers alone count
        every = group.b(xa).view(x.shape[0] * group.slots, group.out)  # [T * slots, out]
        return every.index_select(0, self._pick)


class _Wrapped:
    """One of a decoder layer's products (a matrix, or a :class:`chat.models.decoder.model.Fused` group) with each row's
    adapter update added to its output."""

    def __init__(self, base: Any, key: str, fused: bool, step: LoraStep) -> None:
        self.base = base  # the product as it was: Fused (-> list of parts) or a matrix (-> tensor)
        self.key = key  # "layers.{i}.{qkv,o,gate_up,down}"
        self.fused = fused
        self.step = step

    def __call__(self, x: torch.Tensor) -> Any:
        stack = self.step.stack
        if stack is None or self.key not in stack.groups:
            return self.base(x)
        if not self.fused:
            y = self.base(x)
            self.step.add(self.key, x, y)
            return y
        fused = self.base  # as Fused computes it: whole up to its matrix's fuse_rows, by parts above
        if x.shape[0] <= fused.matrix.fuse_rows:
            y = fused.matrix(x)
            self.step.add(self.key, x, y)
            return [y[:, a:b] for a, b in fused.bounds]
        parts = [part(x) for part in fused.parts]
        self.step.add(self.key, x, parts, fused.bounds)
        return parts

    def __getattr__(self, name: str) -> Any:  # the wrapped object's other attributes (matrix.fuse_rows, ...)
        return getattr(self.base, name)


# ==================================================================== the bank


class AdapterBank:
    """The adapters of one model by name, and their computing forms (see the module docstring). Names are added
    and removed from any thread (:meth:`add`, :meth:`remove`); the forward's side (:meth:`begin`, :meth:`end`) runs
    on the engine's worker only."""

    def __init__(self, decoder: Any, device: torch.device, *, int8: bool, max_loras: int = DEFAULT_MAX_LORAS) -> None:
        self._decoder = decoder
        self.device = device
        self.int8 = int8  # low-rank products as int8 products (int8 and block weight formats)
        self.max_loras = max_loras
        self._lock = threading.Lock()
        self._named: dict[str, LoraAdapter] = {}
        self._resident: OrderedDict[str, _Blocks] = OrderedDict()  # identity -> its blocks, least recently used first
        self._stack: _Stack | None = None  # the resident adapters in computing form
        self.step = LoraStep()
        self._attached = False
        q, kv, _ = decoder.args.qkv_sizes
        width = decoder.args.intermediate
        self._sizes = {"q": q, "k": kv, "v": kv, "o": decoder.args.hidden, "gate": width, "up": width}
        self._sizes["down"] = decoder.args.hidden
        self._outs = {"qkv": q + 2 * kv, "o": decoder.args.hidden, "gate_up": 2 * width, "down": decoder.args.hidden}
        self.swaps_in = 0  # adapters put into computing form (first use, or again after going out)
        self.swaps_out = 0  # computing forms dropped for room

    # ---------------------------------------------------------------- names (any thread)

    def read(self, name: str, path: str, scale: float = 1.0) -> LoraAdapter:
        """Read and check the adapter at ``path`` (not yet added).

        Raises:
            AdapterFileError: unreadable, corrupt, or not served.
            AdapterMismatchError: its modules do not fit the base model.
        """
        weights = read_adapter(path, scale, base_config=getattr(self._decoder, "config", None))
        check_fits(weights.modules, self._decoder.args)
        return make_adapter(name, weights, scale)

    def add(self, adapter: LoraAdapter, *, replace: bool = False) -> LoraAdapter | None:
        """Serve ``adapter`` under its name; returns the one it replaced (None). Raises ValueError when the name is
        taken and not ``replace``."""
        check_fits(adapter.modules, self._decoder.args)
        with self._lock:
            old = self._named.get(adapter.name)
            if old is not None and not replace:
                raise ValueError(f"a LoRA adapter named {adapter.name!r} is already loaded")
            self._named[adapter.name] = adapter
            return old

    def remove(self, name: str) -> LoraAdapter:
        """Stop serving ``name`` (turns in flight under it finish with it). Raises UnknownAdapterError."""
        with self._lock:
            if name not in self._named:
                raise UnknownAdapterError(name)
            return self._named.pop(name)

    def get(self, name: str) -> LoraAdapter:
        """Raises UnknownAdapterError."""
        with self._lock:
            found = self._named.get(name)
        if found is None:
            raise UnknownAdapterError(name)
        return found

    def find(self, name: str) -> LoraAdapter | None:
        with self._lock:
            return self._named.get(name)

    def adapters(self) -> list[LoraAdapter]:
        with self._lock:
            return list(self._named.values())

    # ---------------------------------------------------------------- the forward (worker thread)

    def begin(self, rows: Sequence[LoraAdapter | None]) -> None:
        """Set the adapter of each token row of the forward about to run (None: the base), making the adapters
        resident first (at most ``max_loras`` distinct ones)."""
        present: dict[str, LoraAdapter] = {}
        for adapter in rows:
            if adapter is not None:
                present.setdefault(adapter.identity, adapter)
        if not present:
            self.step.set(None, None)
            return
        if len(present) > self.max_loras:
            raise ValueError(f"{len(present)} adapters in one forward; at most {self.max_loras} are resident")
        self._attach()
        changed = False
        for identity, adapter in present.items():
            if identity not in self._resident:
                while len(self._resident) >= self.max_loras:
                    victim = next(k for k in self._resident if k not in present)
                    del self._resident[victim]
                    self.swaps_out += 1
                smoothing = getattr(self._decoder, "smoothing", {}) or {}
                self._resident[identity] = _Blocks(adapter, smoothing, self._sizes)
                self.swaps_in += 1
                changed = True
            self._resident.move_to_end(identity)
        if changed or self._stack is None or set(self._stack.slots) != set(self._resident):
            self._stack = _Stack(list(self._resident.values()), self.device, self.int8, self._outs)
        slots = self._stack.slots
        self.step.set(self._stack, [-1 if a is None else slots[a.identity] for a in rows], self.device)

    def end(self) -> None:
        self.step.set(None, None)

    @property
    def resident(self) -> list[str]:
        """Identities of the adapters in computing form, least recently used first."""
        return list(self._resident)

    def _attach(self) -> None:
        """Wrap each layer's products, once (by the first forward with an adapter: a model never asked for one
        keeps its products unwrapped)."""
        if self._attached:
            return
        for i, block in enumerate(self._decoder.layers):
            for group in GROUPS:
                base = getattr(block, group)
                wrapped = _Wrapped(base, f"layers.{i}.{group}", group in ("qkv", "gate_up"), self.step)
                block._modules.pop(group, None)  # a matrix that is a module: a plain attribute from now on
                object.__setattr__(block, group, wrapped)
        self._attached = True
