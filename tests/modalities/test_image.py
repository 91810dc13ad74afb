"""Image decoding: formats, EXIF orientation, RGB conversion, limits and bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image, ImageFile, features

from modalities import image
from modalities.errors import CorruptMediaError, MediaTooLargeError, UnsupportedFormatError
from modalities.image import ImageOptions
from modalities.limits import ImageLimits
from tests.modalities import helpers as h

FORMATS = ["JPEG", "PNG", "WEBP"] + (["AVIF"] if features.check("avif") else [])
LOSSLESS = {"PNG"}


def quadrants(im: Image.Image) -> tuple[tuple[int, ...], ...]:
    """Colours sampled well inside the four quadrants: top-left, top-right, bottom-left, bottom-right."""
    arr = np.asarray(im).astype(int)
    hh, ww = arr.shape[0], arr.shape[1]
    points = [(hh // 4, ww // 4), (hh // 4, 3 * ww // 4), (3 * hh // 4, ww // 4), (3 * hh // 4, 3 * ww // 4)]
    return tuple(tuple(arr[y, x]) for y, x in points)


def close(a: tuple, b: tuple, tol: int) -> bool:
    return all(abs(x - y) <= tol for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True))


# ---- formats --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_decodes_to_rgb(fmt: str) -> None:
    picture = h.picture(64, 48)
    decoded = image.decode(h.encode_image(picture, fmt), item=0)
    assert decoded.container == fmt.lower()
    assert decoded.image.mode == "RGB"
    assert (decoded.width, decoded.height) == (64, 48)
    assert decoded.nbytes == 64 * 48 * 3
    assert close(quadrants(decoded.image), quadrants(picture), 0 if fmt in LOSSLESS else 12)


def test_avif_support_matches_pillow() -> None:
    assert ("avif" in image.CONTAINERS) == bool(features.check("avif"))


def test_exif_orientation_is_applied() -> None:
    data, upright = h.rotated_jpeg(orientation=6)
    decoded = image.decode(data)
    assert decoded.image.size == upright.size == (64, 48)
    assert close(quadrants(decoded.image), quadrants(upright), 12)


def test_exif_orientation_can_be_ignored() -> None:
    data, upright = h.rotated_jpeg(orientation=6)
    decoded = image.decode(data, options=ImageOptions(exif_transpose=False))
    assert decoded.image.size == (48, 64)  # as stored: sideways
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    assert close(quadrants(decoded.image), quadrants(stored), 12)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
def test_malformed_exif_means_no_rotation() -> None:
    picture = h.picture(64, 48)
    data = h.encode_image(picture, "JPEG", quality=95, exif=b"Exif\x00\x00MM\x00*garbage")
    decoded = image.decode(data)
    assert decoded.image.size == (64, 48)


def test_transparency_is_composited_onto_the_background() -> None:
    rgba = Image.new("RGBA", (8, 8), (255, 0, 0, 0))  # fully transparent red
    rgba.putpixel((0, 0), (0, 0, 255, 255))  # one opaque blue pixel
    data = h.encode_image(rgba, "PNG")
    white = np.asarray(image.decode(data).image)
    assert tuple(white[4, 4]) == (255, 255, 255)
    assert tuple(white[0, 0]) == (0, 0, 255)
    black = np.asarray(image.decode(data, options=ImageOptions(background=(0, 0, 0))).image)
    assert tuple(black[4, 4]) == (0, 0, 0)


def test_palette_with_transparency_and_gray_alpha() -> None:
    pal = h.picture(16, 16).convert("P")
    pal.info["transparency"] = 0
    assert image.decode(h.encode_image(pal, "PNG", transparency=0)).image.mode == "RGB"
    la = Image.new("LA", (4, 4), (10, 0))
    assert tuple(np.asarray(image.decode(h.encode_image(la, "PNG")).image)[0, 0]) == (255, 255, 255)


def test_sixteen_bit_grayscale_is_scaled_not_clipped() -> None:
    gray16 = Image.fromarray(np.full((4, 4), 32896, dtype=np.uint16))  # 0x8080: mid-gray
    decoded = image.decode(h.encode_image(gray16, "PNG"))
    assert tuple(np.asarray(decoded.image)[0, 0]) == (128, 128, 128)


@pytest.mark.parametrize("mode", ["L", "CMYK", "1"])
def test_other_modes_end_up_rgb(mode: str) -> None:
    fmt = "PNG" if mode == "1" else "JPEG"
    decoded = image.decode(h.encode_image(h.picture(16, 16, mode), fmt))
    assert decoded.image.mode == "RGB"


def test_declared_type_must_match() -> None:
    png = h.encode_image(h.picture(), "PNG")
    assert image.decode(png, declared="image/png").container == "png"
    with pytest.raises(UnsupportedFormatError) as info:
        image.decode(png, declared="image/jpeg", item=3)
    assert (info.value.code, info.value.item) == ("format_mismatch", 3)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_unsupported(fmt: str) -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        image.decode(h.encode_image(h.picture(), fmt), item=1)
    assert info.value.code == "unsupported_format"


# ---- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("keep", [0.5, 0.1])
def test_truncated_images_are_corrupt(fmt: str, keep: float) -> None:
    data = h.encode_image(h.picture(128, 96), fmt)
    with pytest.raises(CorruptMediaError) as info:
        image.decode(data[: max(12, int(len(data) * keep))], item=2)
    assert (info.value.item, info.value.code) == (2, "corrupt_media")


def test_corrupt_bytes_are_corrupt() -> None:
    png = bytearray(h.encode_image(h.picture(), "PNG"))
    png[40:60] = b"\xff" * 20  # breaks the IDAT CRC
    with pytest.raises(CorruptMediaError):
        image.decode(bytes(png), item=0)
    rng = np.random.default_rng(0)
    with pytest.raises(CorruptMediaError):
        image.decode(b"\xff\xd8\xff" + rng.bytes(500), item=0)  # JPEG magic, then noise


def test_zero_length_is_empty() -> None:
    with pytest.raises(CorruptMediaError) as info:
        image.decode(b"", item="a.png")
    assert info.value.code == "empty_media"
    assert "media item 'a.png'" in str(info.value)


def test_decompression_bomb_is_refused_from_its_header(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = h.png_with_size(100_000, 100_000)  # 10^10 pixels declared in ~60 bytes
    assert len(bomb) < 100
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("decoded pixels of a bomb"))
    with pytest.raises(MediaTooLargeError) as info:
        image.decode(bomb, item=5)
    assert (info.value.limit, info.value.maximum, info.value.actual) == ("max_pixels", ImageLimits().max_pixels, 10**10)
    assert info.value.item == 5


def test_pixel_limit_is_checked_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    header_only = h.png_with_size(8_000, 8_000)  # 64 Mpx: above our default, below Pillow's own guard
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("decoded pixels over the limit"))
    with pytest.raises(MediaTooLargeError) as info:
        image.decode(header_only, item=1)
    assert info.value.actual == 64_000_000
    assert "8,000 x 8,000" in str(info.value)


def test_too_many_pixels_for_a_configured_limit() -> None:
    with pytest.raises(MediaTooLargeError) as info:
        image.decode(h.encode_image(h.picture(64, 48), "JPEG"), ImageLimits(max_pixels=1000), item=0)
    assert (info.value.limit, info.value.maximum, info.value.actual) == ("max_pixels", 1000, 3072)


def test_pillows_guard_stays_on_even_with_a_loose_limit() -> None:
    before = Image.MAX_IMAGE_PIXELS
    with pytest.raises(MediaTooLargeError) as info:
        image.decode(h.png_with_size(100_000, 100_000), ImageLimits(max_pixels=10**11))
    assert info.value.limit == "max_pixels"
    assert before == Image.MAX_IMAGE_PIXELS


def test_pillows_bomb_warning_raised_as_error_is_reported_too() -> None:
    size = int((Image.MAX_IMAGE_PIXELS * 1.5) ** 0.5)  # between Pillow's warning and error thresholds
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(MediaTooLargeError):
            image.decode(h.png_with_size(size, size), ImageLimits(max_pixels=10**11))


def test_byte_limit() -> None:
    data = h.encode_image(h.picture(), "PNG")
    with pytest.raises(MediaTooLargeError) as info:
        image.decode(data, ImageLimits(max_bytes=len(data) - 1), item=0)
    assert (info.value.limit, info.value.actual) == ("max_bytes", len(data))
