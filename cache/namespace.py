"""Namespaces: entries of different namespaces never match each other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Namespace:
    """Who may share a cached prefix: same weights, same dtype, same tenant.

    The salt is typically derived from a tenant's credentials; it is left out of ``repr`` so that it never ends up
    in a log line.
    """

    model: str  # fingerprint of the weights and of everything that turns tokens into state
    dtype: str  # torch dtype name of the attention K/V, e.g. "float32"
    salt: str = field(default="", repr=False)  # tenant salt; "" for the shared namespace
