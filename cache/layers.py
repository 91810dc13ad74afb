"""Per-layer state held by a cache entry, and what each kind can serve.

Every attention tensor has its sequence axis at ``-2`` (``[..., tokens, head_dim]``, as transformers lays out K/V).

=============  ==============================================  ==============================================
kind           holds                                           can be restored at length ``n`` when
=============  ==============================================  ==============================================
normal         K/V rows for positions ``[0, T)``               ``n <= T`` (a view; nothing copied)
rotating       K/V rows for ``[T - R, T)``, window ``W``       ``n == T``, or ``n < T`` while rows
                                                               ``[max(0, n - W + 1), n)`` are still held
recurrent      conv/SSM state snapshots at chosen lengths      ``n`` is one of the snapshot lengths (cloned:
                                                               models update this state in place)
stateless      nothing (shared or attention-free layers)       always
=============  ==============================================  ==============================================

A rotating layer that holds more than ``W - 1`` rows keeps a *margin*: it can be rewound by up to
``R - (W - 1)`` tokens. With no margin it serves only its exact length (and any ``n`` while it has not rolled over).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from cache.errors import LayoutError, LengthError

Move = Callable[[torch.Tensor], torch.Tensor]


def _check_kv(keys: object, values: object, what: str) -> None:
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise LayoutError(f"{what}: keys and values must be tensors")
    if keys.dim() < 2:
        raise LayoutError(f"{what}: K/V need at least 2 dims [..., tokens, head_dim], got {tuple(keys.shape)}")
    if keys.shape[:-1] != values.shape[:-1] or keys.dtype != values.dtype or keys.device != values.device:
        raise LayoutError(
            f"{what}: keys {tuple(keys.shape)} {keys.dtype} and values {tuple(values.shape)} {values.dtype} disagree"
        )


@dataclass(frozen=True, slots=True)
class NormalKV:
    """Full-attention K/V for positions ``[0, length)``."""

    keys: torch.Tensor  # [..., length, head_dim]
    values: torch.Tensor  # [..., length, head_dim_v]

    def __post_init__(self) -> None:
        _check_kv(self.keys, self.values, "normal layer")

    @property
    def length(self) -> int:
        return self.keys.shape[-2]


@dataclass(frozen=True, slots=True)
class RotatingKV:
    """Sliding-window K/V: the last ``rows`` positions ``[seen - rows, seen)`` of a layer with window ``window``."""

    keys: torch.Tensor  # [..., rows, head_dim]
    values: torch.Tensor  # [..., rows, head_dim_v]
    window: int  # attention window W: a query attends to itself and the W - 1 positions before it
    seen: int  # tokens the layer has seen (T)

    def __post_init__(self) -> None:
        _check_kv(self.keys, self.values, "rotating layer")
        if not isinstance(self.window, int) or self.window < 1:
            raise LengthError(f"rotating layer: window must be a positive integer, got {self.window!r}")
        if not isinstance(self.seen, int) or self.seen < 0:
            raise LengthError(f"rotating layer: seen must be a non-negative integer, got {self.seen!r}")
        if self.rows > self.seen:
            raise LengthError(f"rotating layer: holds {self.rows} rows but has seen only {self.seen} tokens")
        if self.rows < min(self.seen, self.window - 1):
            raise LengthError(
                f"rotating layer: {self.rows} rows cannot serve window {self.window} at length {self.seen}"
            )

    @property
    def rows(self) -> int:
        return self.keys.shape[-2]

    @property
    def first_held(self) -> int:
        """Position of the oldest row held."""
        return self.seen - self.rows

    def shortest(self) -> int:
        """The shortest length this layer can be restored at (every length up to ``seen`` from there on)."""
        if self.first_held == 0:
            return 0
        return self.first_held + self.window - 1


@dataclass(frozen=True, slots=True)
class RecurrentState:
    """Recurrent (conv / SSM / linear-attention) state, as snapshots taken at chosen lengths."""

    snapshots: Mapping[int, tuple[torch.Tensor, ...]]  # length -> the layer's state tensors after that many tokens

    def __post_init__(self) -> None:
        if not isinstance(self.snapshots, Mapping) or not self.snapshots:
            raise LengthError("recurrent layer: needs at least one snapshot")
        frozen: dict[int, tuple[torch.Tensor, ...]] = {}
        for length, tensors in sorted(self.snapshots.items()):
            if not isinstance(length, int) or length < 1:
                raise LengthError(f"recurrent layer: snapshot lengths must be positive integers, got {length!r}")
            tensors = tuple(tensors)
            if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
                raise LayoutError(f"recurrent layer: snapshot at {length} must be a non-empty tuple of tensors")
            frozen[length] = tensors
        shapes = {tuple((tuple(t.shape), t.dtype) for t in ts) for ts in frozen.values()}
        if len(shapes) != 1:
            raise LayoutError("recurrent layer: snapshots disagree in shape or dtype")
        object.__setattr__(self, "snapshots", MappingProxyType(frozen))


@dataclass(frozen=True, slots=True)
class RecurrentSnapshot:
    """A recurrent layer's state at one length, owned by the caller (a copy)."""

    length: int  # tokens the state has absorbed
    tensors: tuple[torch.Tensor, ...] = field(repr=False)  # conv/SSM state, in the adapter's order


@dataclass(frozen=True, slots=True)
class Stateless:
    """A layer with no state of its own (it shares another layer's, or is attention-free)."""


LayerState = NormalKV | RotatingKV | RecurrentState | Stateless
RestoredLayer = NormalKV | RotatingKV | RecurrentSnapshot | Stateless


def layer_length(state: LayerState) -> int | None:
    """The sequence length a stored layer state stands for, or None when it has none of its own."""
    if isinstance(state, NormalKV):
        return state.length
    if isinstance(state, RotatingKV):
        return state.seen
    if isinstance(state, RecurrentState):
        return max(state.snapshots)
    return None


def signature(state: LayerState) -> tuple:
    """What must be equal between entries of one namespace: kind, shapes apart from length, dtypes."""
    if isinstance(state, NormalKV):
        return (
            "normal",
            tuple(state.keys.shape[:-2]),
            state.keys.shape[-1],
            state.values.shape[-1],
            state.keys.dtype,
        )
    if isinstance(state, RotatingKV):
        return (
            "rotating",
            tuple(state.keys.shape[:-2]),
            state.keys.shape[-1],
            state.values.shape[-1],
            state.keys.dtype,
            state.window,
        )
    if isinstance(state, RecurrentState):
        first = next(iter(state.snapshots.values()))
        return ("recurrent", tuple((tuple(t.shape), t.dtype) for t in first))
    if isinstance(state, Stateless):
        return ("stateless",)
    raise LayoutError(f"unknown layer state type {type(state).__name__}")


def attention_dtype(state: LayerState) -> torch.dtype | None:
    if isinstance(state, NormalKV | RotatingKV):
        return state.keys.dtype
    return None


def tensors_of(state: LayerState) -> Iterator[torch.Tensor]:
    if isinstance(state, NormalKV | RotatingKV):
        yield state.keys
        yield state.values
    elif isinstance(state, RecurrentState):
        for ts in state.snapshots.values():
            yield from ts


def moved(state: LayerState, move: Move) -> LayerState:
    """The same state with every tensor passed through ``move`` (used to change tiers)."""
    if isinstance(state, NormalKV):
        return NormalKV(move(state.keys), move(state.values))
    if isinstance(state, RotatingKV):
        return RotatingKV(move(state.keys), move(state.values), state.window, state.seen)
    if isinstance(state, RecurrentState):
        return RecurrentState({n: tuple(move(t) for t in ts) for n, ts in state.snapshots.items()})
    return state


def restore(state: LayerState, n: int) -> RestoredLayer:
    """The layer's state after the first ``n`` tokens. The caller has checked that ``n`` is servable.

    Attention K/V come back as views of the stored tensors (the model must not write into them); recurrent state is
    cloned, because models update it in place.
    """
    if isinstance(state, NormalKV):
        return NormalKV(state.keys[..., :n, :], state.values[..., :n, :])
    if isinstance(state, RotatingKV):
        lo = max(0, n - state.window + 1) - state.first_held
        hi = n - state.first_held
        return RotatingKV(state.keys[..., lo:hi, :], state.values[..., lo:hi, :], state.window, n)
    if isinstance(state, RecurrentState):
        return RecurrentSnapshot(n, tuple(t.clone() for t in state.snapshots[n]))
    return state
