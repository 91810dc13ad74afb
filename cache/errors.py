"""Errors raised by the prefix cache.

Every error the cache raises on bad input derives from :class:`CacheError`; the cache is left unchanged when one is
raised (validation happens before any mutation)::

    CacheError
    ├── LayoutError         layer states whose count, kind, shape, dtype or device do not fit the namespace
    ├── LengthError         negative or inconsistent lengths (tokens, windows, snapshots, extras)
    ├── SpanError           media spans out of range, empty or overlapping
    ├── TokenError          token ids that are not integers in [0, 2**31)
    ├── NamespaceError      a match or lease used with another namespace or another cache
    └── LeaseError          a lease released twice, or a match whose entry is gone
"""

from __future__ import annotations


class CacheError(ValueError):
    """Base class of every error raised by :mod:`cache`."""


class LayoutError(CacheError):
    """Layer states do not fit the namespace's layout (count, kind, shape, dtype) or each other."""


class LengthError(CacheError):
    """A length is negative, or lengths that must agree do not."""


class SpanError(CacheError):
    """A media span is empty, out of range, or overlaps another."""


class TokenError(CacheError):
    """A token id is not an integer in [0, 2**31)."""


class NamespaceError(CacheError):
    """A match or lease was handed to a cache or namespace it does not belong to."""


class LeaseError(CacheError):
    """A lease was released twice, or a match refers to an entry that no longer exists."""
