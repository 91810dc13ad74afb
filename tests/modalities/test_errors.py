"""The error hierarchy: one base class, item and code on every error, readable messages."""

from __future__ import annotations

import pytest

import modalities.errors as errors
from modalities.errors import (
    CorruptMediaError,
    MediaError,
    MediaTooLargeError,
    MediaURLError,
    UnsupportedFormatError,
)

LEAVES = [MediaURLError, CorruptMediaError, UnsupportedFormatError, MediaTooLargeError]


@pytest.mark.parametrize("cls", LEAVES)
def test_every_error_is_a_media_error_and_drawn_in_the_docstring(cls: type[MediaError]) -> None:
    assert issubclass(cls, MediaError)
    assert issubclass(cls, ValueError)
    assert cls.__name__ in errors.__doc__


def test_message_names_the_item_by_index_or_name() -> None:
    by_index = CorruptMediaError("the PNG image is truncated or corrupt.", item=2)
    assert str(by_index) == "media item 2: the PNG image is truncated or corrupt."
    assert by_index.item == 2
    assert by_index.code == "corrupt_media"
    by_name = UnsupportedFormatError("x is not supported.", item="cat.gif", code="format_mismatch")
    assert str(by_name) == "media item 'cat.gif': x is not supported."
    assert by_name.code == "format_mismatch"
    anonymous = MediaURLError("the content is not valid base64.", code="invalid_base64")
    assert str(anonymous) == "The content is not valid base64."
    assert anonymous.item is None


def test_too_large_carries_the_limit_its_value_and_what_was_found() -> None:
    exc = MediaTooLargeError("the image is too big.", limit="max_pixels", maximum=100, actual=200, item=0)
    assert (exc.limit, exc.maximum, exc.actual, exc.code) == ("max_pixels", 100, 200, "media_too_large")


def test_for_item_copies_the_error_with_another_item() -> None:
    exc = MediaTooLargeError("the image is too big.", limit="max_pixels", maximum=100, actual=200)
    named = exc.for_item(3)
    assert type(named) is MediaTooLargeError
    assert str(named) == "media item 3: the image is too big."
    assert (named.item, named.limit, named.maximum, named.actual) == (3, "max_pixels", 100, 200)
    assert exc.item is None  # the original is untouched
