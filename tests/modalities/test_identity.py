"""Content hashes (bytes + settings, before decoding) and data: URLs."""

from __future__ import annotations

import base64
import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modalities import audio, image, video
from modalities.audio import AudioOptions
from modalities.errors import MediaTooLargeError, MediaURLError
from modalities.identity import content_hash, decode_base64, fingerprint, media_digest, parse_data_url
from modalities.image import ImageOptions
from modalities.video import VideoOptions
from tests.modalities import helpers as h

PROC = "Qwen2VLImageProcessorPil"

# ---- content hashes -------------------------------------------------------------------------------------------


def test_same_bytes_and_settings_give_the_same_hash() -> None:
    data = h.encode_image(h.picture(), "PNG")
    a = content_hash(data, image.fingerprint(PROC, ImageOptions(), {"max_pixels": 1_003_520}))
    b = content_hash(bytes(data), image.fingerprint(PROC, ImageOptions(), {"max_pixels": 1_003_520}))
    assert a == b
    assert len(a) == 64 and int(a, 16) >= 0


def test_hash_is_stable_across_releases() -> None:
    """Pinned: changing the hashing scheme silently would invalidate every stored cache entry. (Version 2 hashes the
    bytes' sha256 instead of the bytes, so that a digest kept with a stored message is enough.)"""
    fp = fingerprint("image", "P", {"max_pixels": 100})
    assert fp.text == '{"kind":"image","processor":"P","settings":{"max_pixels":100}}'
    inner = hashlib.sha256(b"abc").digest()
    expected = hashlib.sha256(b"turncache-media/2\0" + hashlib.sha256(fp.text.encode()).digest() + inner)
    assert content_hash(b"abc", fp) == expected.hexdigest()
    assert content_hash(b"abc", fp) == "7f81ec945273745bb4f1d04b7594798ecd54681adb3350694ca62117cbf1ce89"


def test_the_bytes_digest_gives_the_same_hash_as_the_bytes() -> None:
    fp = fingerprint("image", "P", {"max_pixels": 100})
    data = h.encode_image(h.picture(), "PNG")
    assert media_digest(data) == hashlib.sha256(data).hexdigest()
    assert content_hash(media_digest(data), fp) == content_hash(data, fp)
    with pytest.raises(ValueError, match="64 hex digits"):
        content_hash("abc", fp)


@pytest.mark.parametrize(
    "other",
    [
        lambda: image.fingerprint(PROC, ImageOptions(), {"max_pixels": 2_000_000}),
        lambda: image.fingerprint("LlavaImageProcessorPil", ImageOptions(), {"max_pixels": 1_003_520}),
        lambda: image.fingerprint(PROC, ImageOptions(exif_transpose=False), {"max_pixels": 1_003_520}),
        lambda: image.fingerprint(PROC, ImageOptions(background=(0, 0, 0)), {"max_pixels": 1_003_520}),
        lambda: image.fingerprint(PROC, ImageOptions(), {"max_pixels": 1_003_520, "patch_size": 14}),
        # same settings, another kind
        lambda: fingerprint(
            "video", PROC, {"decode": ImageOptions().settings(), "processor": {"max_pixels": 1_003_520}}
        ),
    ],
)
def test_different_settings_give_different_hashes(other) -> None:
    data = h.encode_image(h.picture(), "PNG")
    fp = image.fingerprint(PROC, ImageOptions(), {"max_pixels": 1_003_520})
    assert (
        fp.text
        == fingerprint(
            "image", PROC, {"decode": ImageOptions().settings(), "processor": {"max_pixels": 1_003_520}}
        ).text
    )
    assert content_hash(data, other()) != content_hash(data, fp)


def test_decoder_options_of_each_kind_are_in_the_fingerprint() -> None:
    data = b"same bytes"
    assert content_hash(data, audio.fingerprint("W", AudioOptions(16_000))) != content_hash(
        data, audio.fingerprint("W", AudioOptions(24_000))
    )
    assert content_hash(data, video.fingerprint("V", VideoOptions(num_frames=8))) != content_hash(
        data, video.fingerprint("V", VideoOptions(num_frames=16))
    )
    assert content_hash(data, video.fingerprint("V", VideoOptions(fps=2))) != content_hash(
        data, video.fingerprint("V", VideoOptions(fps=1))
    )
    assert content_hash(data, image.fingerprint("X")) != content_hash(data, audio.fingerprint("X"))


def test_different_bytes_give_different_hashes() -> None:
    fp = image.fingerprint(PROC)
    assert content_hash(b"a", fp) != content_hash(b"b", fp)


def test_equivalent_spellings_of_settings_hash_the_same() -> None:
    a = fingerprint("image", "P", {"size": (2, 3), "scale": 2.0, "b": 1, "a": np.int64(5)})
    b = fingerprint("image", "P", {"a": 5, "b": 1, "scale": 2, "size": [2, 3]})
    assert a == b


def test_unfingerprintable_settings_are_programming_errors() -> None:
    with pytest.raises(TypeError, match=r"settings\.obj"):
        fingerprint("image", "P", {"obj": object()})
    with pytest.raises(TypeError, match="names must be strings"):
        fingerprint("image", "P", {1: 2})
    with pytest.raises(ValueError, match="finite"):
        fingerprint("image", "P", {"x": float("nan")})


def test_hash_is_computed_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args, **kwargs):
        raise AssertionError("content_hash must not decode")

    import PIL.Image
    import soundfile

    monkeypatch.setattr(PIL.Image, "open", explode)
    monkeypatch.setattr(soundfile, "SoundFile", explode)
    monkeypatch.setattr(image, "decode", explode)
    key = content_hash(h.encode_image(h.picture(), "PNG"), image.fingerprint(PROC))
    assert len(key) == 64
    assert content_hash(b"not even an image", image.fingerprint(PROC))  # garbage hashes fine too


# ---- data URLs ------------------------------------------------------------------------------------------------


def test_parse_data_url() -> None:
    payload = h.encode_image(h.picture(), "PNG")
    url = "data:image/PNG;base64," + base64.b64encode(payload).decode()
    parsed = parse_data_url(url)
    assert (parsed.mime, parsed.params, parsed.data) == ("image/png", (), payload)
    parsed = parse_data_url("data:audio/webm;codecs=opus;base64,AAEC")
    assert (parsed.mime, parsed.params, parsed.data) == ("audio/webm", (("codecs", "opus"),), b"\x00\x01\x02")


def test_base64_tolerates_whitespace_and_missing_padding() -> None:
    assert decode_base64("QUJD\nRA") == b"ABCD"
    assert decode_base64(" QUJDRA== ") == b"ABCD"
    assert parse_data_url("data:image/png;base64,QUJD RA=").data == b"ABCD"


@pytest.mark.parametrize("text", ["QUJD\nRA==", "QUJDRA", "QUJD RA=", "QUJDRA===", "QUJD*A=="])
def test_strict_base64_takes_only_the_padded_alphabet(text: str) -> None:
    assert decode_base64("QUJDRA==", strict=True) == b"ABCD"
    with pytest.raises(MediaURLError) as info:
        parse_data_url(f"data:image/png;base64,{text}", item=1, strict=True)
    assert info.value.code == "invalid_base64"


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("https://example.com/cat.png", "remote_url"),
        ("http://169.254.169.254/latest/meta-data", "remote_url"),
        ("file:///etc/passwd", "remote_url"),
        ("ftp://example.com/a.wav", "remote_url"),
        ("/etc/passwd", "invalid_url"),
        ("cat.png", "invalid_url"),
        ("data:image/png,rawtext", "invalid_url"),
        ("data:image/png;base64", "invalid_url"),
        ("data:not a mime;base64,AAAA", "invalid_url"),
        ("data:image/png;charset;base64,AAAA", "invalid_url"),
        ("data:image/png;base64,QUJD*A==", "invalid_base64"),
        ("data:image/png;base64,QUJDR", "invalid_base64"),
        ("data:image/png;base64,QQ==QQ==", "invalid_base64"),
        ("data:image/png;base64,QUJDRA===", "invalid_base64"),
        ("data:image/png;base64,QUJDé", "invalid_base64"),
    ],
)
def test_bad_urls_get_typed_errors(url: str, code: str) -> None:
    with pytest.raises(MediaURLError) as info:
        parse_data_url(url, item=7)
    assert info.value.code == code
    assert info.value.item == 7
    assert str(info.value).startswith("media item 7: ")


def test_a_url_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(MediaURLError, match="Expected a data URL string"):
        parse_data_url(b"data:image/png;base64,AAAA")  # type: ignore[arg-type]


def test_max_bytes_is_checked_before_decoding_the_base64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base64, "b64decode", lambda *a, **k: pytest.fail("decoded a payload over the limit"))
    url = "data:video/mp4;base64," + "A" * 4_000_000
    with pytest.raises(MediaTooLargeError) as info:
        parse_data_url(url, max_bytes=1_000_000, item=0)
    assert (info.value.limit, info.value.maximum) == ("max_bytes", 1_000_000)
    assert info.value.actual == 3_000_000


def test_max_bytes_is_exact_after_decoding() -> None:
    url = "data:image/png;base64," + base64.b64encode(b"x" * 101).decode()
    assert len(parse_data_url(url, max_bytes=101).data) == 101
    with pytest.raises(MediaTooLargeError):
        parse_data_url(url, max_bytes=100)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["image/png", "audio/wav", "video/mp4", ""]))
def test_data_url_round_trip(payload: bytes, mime: str) -> None:
    url = f"data:{mime};base64,{base64.b64encode(payload).decode()}"
    parsed = parse_data_url(url)
    assert (parsed.mime, parsed.data) == (mime, payload)


def test_there_is_one_content_hash_type() -> None:
    """Defined here, where it is computed; the cache (which imports nothing of turncache) compares it as a string and
    defines no look-alike."""
    import cache
    import cache.media
    from modalities.identity import ContentHash

    assert not hasattr(cache, "ContentHash") and not hasattr(cache.media, "ContentHash")
    assert ContentHash.__supertype__ is str
