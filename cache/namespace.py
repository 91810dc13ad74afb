"""Namespaces: entries of different namespaces never match each other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Namespace:
    """Who may share a cached prefix: same weights, same dtype, same tenant, same tagged components.

    The salt is typically derived from a tenant's credentials; it is left out of ``repr`` so that it never ends up
    in a log line.

    ``components`` are further ``(tag, value)`` pairs that change what a prefix computes to, e.g. a LoRA adapter's
    ``("lora", <digest of its weights and scale>)``: always tagged, so that no value of one kind can ever equal a
    value of another kind (an adapter's digest is never mistaken for a salt, nor the reverse). Sorted by tag and
    unique per tag (:meth:`with_component`), so that the same components give the same namespace in any order.
    """

    model: str  # fingerprint of the weights and of everything that turns tokens into state
    dtype: str  # torch dtype name of the attention K/V, e.g. "float32"
    salt: str = field(default="", repr=False)  # tenant salt; "" for the shared namespace
    components: tuple[tuple[str, str], ...] = ()  # (tag, value) pairs, sorted by tag; () for the base model

    def __post_init__(self) -> None:
        tags = [pair[0] for pair in self.components]
        if any(
            not (isinstance(p, tuple) and len(p) == 2 and all(isinstance(v, str) for v in p)) for p in self.components
        ):
            raise TypeError("namespace components are (tag, value) pairs of strings")
        if tags != sorted(set(tags)) or any(not tag for tag in tags):
            raise ValueError(f"namespace component tags must be non-empty, unique and sorted, got {tags}")

    def with_component(self, tag: str, value: str) -> Namespace:
        """This namespace with ``(tag, value)`` added (replacing the value of an equal tag)."""
        pairs = dict(self.components)
        pairs[tag] = value
        return Namespace(self.model, self.dtype, self.salt, tuple(sorted(pairs.items())))
