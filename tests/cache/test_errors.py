"""cache.errors: one hierarchy, every error a ValueError (bad input), so callers catch CacheError or ValueError."""

from __future__ import annotations

from cache import CacheError, LayoutError, LeaseError, LengthError, NamespaceError, SpanError, TokenError


def test_every_cache_error_is_a_value_error():
    for error in (LayoutError, LengthError, SpanError, TokenError, NamespaceError, LeaseError):
        assert issubclass(error, CacheError) and issubclass(error, ValueError)
