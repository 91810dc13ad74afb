"""modalities.parts: a media item hashes its bytes once when made, and keeps base64 text undecoded until a decoder
asks for the bytes."""

from __future__ import annotations

import base64
import hashlib

import pytest

from modalities.errors import MediaURLError
from modalities.parts import Base64Text, MediaInput

DATA = b"\x89PNG not really a picture"


def test_an_item_from_bytes_carries_their_sha256_and_gives_them_back():
    item = MediaInput.from_bytes("image", bytearray(DATA), "image/png", "messages[0].content[1]")
    assert item.digest == hashlib.sha256(DATA).hexdigest()
    assert item.data == DATA and isinstance(item.source, bytes)
    assert (item.kind, item.declared, item.item) == ("image", "image/png", "messages[0].content[1]")
    assert DATA.hex() not in repr(item) and "source" not in repr(item)  # the bytes stay out of logs


def test_base64_text_is_decoded_from_where_it_starts_on_each_use():
    url = "data:image/png;base64," + base64.b64encode(DATA).decode()
    text = Base64Text(url, url.index(",") + 1)
    item = MediaInput("image", hashlib.sha256(DATA).hexdigest(), text, "image/png")
    assert item.data == DATA and item.data == DATA
    assert item.item == "media"  # the default name in errors


@pytest.mark.parametrize("payload", ["@@@@", "QUJ", "QU JD"])  # not base64; unpadded; with a space (strict only)
def test_base64_text_that_skipped_validation_fails_as_a_media_url_error(payload):
    with pytest.raises(MediaURLError):
        Base64Text("data:image/png;base64," + payload, 22).decode()
