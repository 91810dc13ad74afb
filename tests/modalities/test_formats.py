"""Sniffing containers from their first bytes, and matching them with the declared type."""

from __future__ import annotations

import pytest

from modalities.errors import CorruptMediaError, UnsupportedFormatError
from modalities.formats import identify, normalize_declared, sniff
from tests.modalities import helpers as h

SAMPLES = {
    "jpeg": lambda: h.encode_image(h.picture(), "JPEG"),
    "png": lambda: h.encode_image(h.picture(), "PNG"),
    "webp": lambda: h.encode_image(h.picture(), "WEBP"),
    "avif": lambda: h.encode_image(h.picture(), "AVIF"),
    "gif": lambda: h.encode_image(h.picture(), "GIF"),
    "bmp": lambda: h.encode_image(h.picture(), "BMP"),
    "tiff": lambda: h.encode_image(h.picture(), "TIFF"),
    "wav": lambda: h.sf_audio("WAV"),
    "flac": lambda: h.sf_audio("FLAC"),
    "ogg": lambda: h.sf_audio("OGG", "VORBIS"),
    "mp3": lambda: h.sf_audio("MP3"),
    "isobmff": lambda: h.av_audio("mp4", "aac", seconds=0.1),
    "ebml": lambda: h.av_audio("webm", "libopus", seconds=0.1),
    "aac": lambda: h.av_audio("adts", "aac", seconds=0.1),
}


@pytest.mark.parametrize("container", sorted(SAMPLES))
def test_sniff_recognizes_generated_files(container: str) -> None:
    assert sniff(SAMPLES[container]()) == container


def test_sniff_tells_mp4_video_from_avif() -> None:
    assert sniff(h.av_video("mp4", "libx264", frames=2)) == "isobmff"
    assert sniff(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic") == "heif"


@pytest.mark.parametrize("data", [b"", b"hello world", b"\x00" * 64, b"<svg xmlns=...>"])
def test_sniff_returns_none_for_unknown_bytes(data: bytes) -> None:
    assert sniff(data) is None


@pytest.mark.parametrize(
    ("declared", "container"),
    [
        ("image/jpeg", "jpeg"),
        ("image/JPG", "jpeg"),
        ("image/png; charset=binary", "png"),
        ("audio/webm;codecs=opus", "ebml"),
        ("wav", "wav"),
        ("mp3", "mp3"),
        ("audio/x-m4a", "isobmff"),
        ("video/mp4", "isobmff"),
        ("image/svg+xml", None),
        ("", None),
    ],
)
def test_normalize_declared(declared: str, container: str | None) -> None:
    assert normalize_declared(declared) == container


ACCEPTED = frozenset({"png", "jpeg"})


def test_identify_checks_declared_against_bytes() -> None:
    png = SAMPLES["png"]()
    assert identify(png, None, ACCEPTED, "image", 0) == "png"
    assert identify(png, "image/png", ACCEPTED, "image", 0) == "png"
    with pytest.raises(UnsupportedFormatError) as info:
        identify(png, "image/jpeg", ACCEPTED, "image", 4)
    assert info.value.code == "format_mismatch"
    assert info.value.item == 4
    assert "declared as 'image/jpeg' but is PNG" in str(info.value)


def test_identify_refuses_unknown_unaccepted_and_empty() -> None:
    with pytest.raises(UnsupportedFormatError, match="not a supported image format") as info:
        identify(SAMPLES["png"](), "image/svg+xml", ACCEPTED, "image", 1)
    assert info.value.code == "unsupported_format"
    with pytest.raises(UnsupportedFormatError, match="GIF is not a supported image format"):
        identify(SAMPLES["gif"](), None, ACCEPTED, "image", 1)
    with pytest.raises(UnsupportedFormatError, match="not a recognized image format"):
        identify(b"hello world", None, ACCEPTED, "image", 1)
    with pytest.raises(CorruptMediaError) as empty:
        identify(b"", "image/png", ACCEPTED, "image", 1)
    assert empty.value.code == "empty_media"


@pytest.mark.parametrize("generic", ["", "application/octet-stream", " Application/Octet-Stream ; x=1"])
def test_an_empty_or_generic_declared_type_counts_as_none(generic: str) -> None:
    assert identify(SAMPLES["png"](), generic, ACCEPTED, "image", 0) == "png"
