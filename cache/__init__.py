"""turncache's prefix cache: pure torch and data structures (no transformers, no asyncio).

Public surface: :class:`PrefixCache` (insert / lookup / acquire / release / evict / stats / check_invariants, and
flush / close for its disk tier), the layer-state types, media spans, namespaces, the error hierarchy and
:func:`shared_prefix_length`. See ``cache/DESIGN.md``.
"""

from cache.errors import (
    CacheError,
    LayoutError,
    LeaseError,
    LengthError,
    NamespaceError,
    SpanError,
    TokenError,
)
from cache.layers import (
    LayerState,
    NormalKV,
    RecurrentSnapshot,
    RecurrentState,
    RestoredLayer,
    RotatingKV,
    Stateless,
)
from cache.media import MediaKind, MediaSpan
from cache.namespace import Namespace
from cache.prefix_cache import DEVICE, DISK, HOST, PrefixCache
from cache.radix import EntryId, shared_prefix_length
from cache.records import CacheStats, Lease, PrefixMatch

__all__ = [
    "DEVICE",
    "DISK",
    "HOST",
    "CacheError",
    "CacheStats",
    "EntryId",
    "LayerState",
    "LayoutError",
    "Lease",
    "LeaseError",
    "LengthError",
    "MediaKind",
    "MediaSpan",
    "Namespace",
    "NamespaceError",
    "NormalKV",
    "PrefixCache",
    "PrefixMatch",
    "RecurrentSnapshot",
    "RecurrentState",
    "RestoredLayer",
    "RotatingKV",
    "SpanError",
    "Stateless",
    "TokenError",
    "shared_prefix_length",
]
