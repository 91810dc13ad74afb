"""Small builders of layer states for cache tests. Tensors are tiny and independent (no shared storage)."""

from __future__ import annotations

import torch

from cache import MediaKind, MediaSpan, NormalKV, RecurrentState, RotatingKV, Stateless

HEADS, DIM = 1, 2


def normal(length: int, fill: float = 0.0) -> NormalKV:
    rows = torch.arange(length, dtype=torch.float32).view(1, HEADS, length, 1).expand(1, HEADS, length, DIM)
    return NormalKV(rows.clone() + fill, rows.clone() - fill)


def rotating(length: int, window: int, rows: int | None = None) -> RotatingKV:
    """A sliding-window layer that has seen ``length`` tokens and holds the last ``rows`` of them
    (default: window - 1, no margin). Row i holds its position number so that tests can check which rows came back."""
    if rows is None:
        rows = min(length, window - 1)
    positions = torch.arange(length - rows, length, dtype=torch.float32).view(1, HEADS, rows, 1)
    k = positions.expand(1, HEADS, rows, DIM).clone()
    return RotatingKV(k, k.clone(), window, length)


def recurrent(points: list[int] | set[int], width: int = 3) -> RecurrentState:
    """Snapshots whose values equal their length, so tests can check which snapshot came back."""
    return RecurrentState({p: (torch.full((1, width), float(p)),) for p in sorted(points)})


def stateless() -> Stateless:
    return Stateless()


def image(start: int, end: int, content: str = "img-a") -> MediaSpan:
    return MediaSpan(start, end, MediaKind.IMAGE, content)


def audio(start: int, end: int, content: str = "aud-a") -> MediaSpan:
    return MediaSpan(start, end, MediaKind.AUDIO, content)


def video(start: int, end: int, content: str = "vid-a") -> MediaSpan:
    return MediaSpan(start, end, MediaKind.VIDEO, content)


def nbytes(layers) -> int:
    from cache.layers import tensors_of

    return sum(t.untyped_storage().nbytes() for layer in layers for t in tensors_of(layer))
