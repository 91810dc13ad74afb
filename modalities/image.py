"""Images: decode to an RGB Pillow image with limits; fingerprint the settings.

Formats: JPEG, PNG, WebP, and AVIF when this Pillow reads it (``PIL.features.check("avif")``; see
:data:`CONTAINERS`). Pillow opens the sniffed format only (``Image.open(..., formats=[...])``). Animated PNG / WebP /
AVIF decode to their first frame.

Order of work, cheapest first: byte limit; sniff and compare with the declared type; read the header; check the
declared width x height against ``max_pixels`` (Pillow's own decompression-bomb guard stays on and is reported the
same way); only then decode the pixels. Then EXIF orientation is applied (if ``exif_transpose``; an unreadable EXIF
block counts as "no orientation"), transparency is composited onto ``background``, 16-bit grayscale is scaled to
8 bits, and everything ends up as ``RGB``.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError, features

from modalities.errors import CorruptMediaError, ItemRef, MediaTooLargeError
from modalities.formats import identify
from modalities.identity import Fingerprint
from modalities.identity import fingerprint as _fingerprint
from modalities.limits import ImageLimits

DEFAULT_LIMITS = ImageLimits()

DECODER_VERSION = 1  # bump when decode() output changes for the same bytes and options
_PIL_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "avif": "AVIF"}
CONTAINERS = frozenset(c for c in _PIL_FORMATS if c != "avif" or features.check("avif"))
_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")


@dataclass(frozen=True, slots=True)
class ImageOptions:
    """Settings that change the decoded output (all of them go into the fingerprint)."""

    exif_transpose: bool = True  # rotate / mirror as the EXIF Orientation tag says, as cameras and browsers do
    background: tuple[int, int, int] = (255, 255, 255)  # colour that transparent pixels are composited onto

    def __post_init__(self) -> None:
        bg = self.background
        if not (isinstance(bg, tuple) and len(bg) == 3 and all(isinstance(c, int) and 0 <= c <= 255 for c in bg)):
            raise ValueError(f"ImageOptions.background must be an (r, g, b) tuple of 0..255, got {bg!r}")

    def settings(self) -> dict[str, object]:
        return {
            "decoder": f"modalities.image/{DECODER_VERSION}",
            "exif_transpose": self.exif_transpose,
            "background": list(self.background),
            "mode": "RGB",
        }


@dataclass(frozen=True, slots=True)
class DecodedImage:
    image: Image.Image  # mode "RGB", orientation applied
    container: str  # sniffed format: "jpeg", "png", "webp" or "avif"

    @property
    def width(self) -> int:
        return self.image.width

    @property
    def height(self) -> int:
        return self.image.height

    @property
    def nbytes(self) -> int:
        """Memory held by the pixels (what a media store charges for this item)."""
        return self.image.width * self.image.height * 3


def fingerprint(
    processor: str, options: ImageOptions = ImageOptions(), processor_settings: Mapping[str, object] | None = None
) -> Fingerprint:
    """Fingerprint of ``options`` followed by ``processor`` (e.g. ``"Qwen2VLImageProcessorPil"``) and its settings
    (max_pixels, patch_size, ...)."""
    return _fingerprint("image", processor, {"decode": options.settings(), "processor": dict(processor_settings or {})})


def decode(
    data: bytes,
    limits: ImageLimits = DEFAULT_LIMITS,
    options: ImageOptions = ImageOptions(),
    *,
    declared: str | None = None,
    item: ItemRef = None,
) -> DecodedImage:
    """Decode one image to RGB.

    Args:
        data: the encoded file.
        limits: bytes and pixels allowed.
        options: EXIF and transparency handling.
        declared: the MIME type the sender gave (from the data URL), or None to trust the bytes.
        item: index or name of the image, carried by every error.

    Raises:
        CorruptMediaError: empty, truncated or undecodable data.
        UnsupportedFormatError: not JPEG / PNG / WebP / AVIF, or ``declared`` does not match the bytes.
        MediaTooLargeError: ``max_bytes`` or ``max_pixels`` exceeded (pixels are checked from the header, before
            decoding; Pillow's decompression-bomb guard is reported as ``max_pixels`` too).
    """
    if len(data) > limits.max_bytes:
        raise MediaTooLargeError(
            f"the image is {len(data):,} bytes; the limit (max_bytes) is {limits.max_bytes:,}.",
            limit="max_bytes",
            maximum=limits.max_bytes,
            actual=len(data),
            item=item,
        )
    container = identify(data, declared, CONTAINERS, "image", item)
    im = _open(data, container, limits, item)
    try:
        im.load()
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise CorruptMediaError(f"the {container.upper()} image is truncated or corrupt.", item=item) from exc
    if options.exif_transpose:
        im = _exif_transpose(im)
    return DecodedImage(image=_to_rgb(im, options.background), container=container)


def _open(data: bytes, container: str, limits: ImageLimits, item: ItemRef) -> Image.Image:
    """Read the header only, and refuse images whose declared size is over the pixel limit."""
    try:
        im = Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[container]])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        found = _BOMB_PIXELS.search(str(exc))
        raise _too_many_pixels(int(found.group(1)) if found else None, None, limits, item) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        raise CorruptMediaError(f"the {container.upper()} image is truncated or corrupt.", item=item) from exc
    width, height = im.size
    if width <= 0 or height <= 0:
        raise CorruptMediaError(f"the image header gives an invalid size {width} x {height}.", item=item)
    if width * height > limits.max_pixels:
        raise _too_many_pixels(width * height, (width, height), limits, item)
    return im


def _too_many_pixels(
    pixels: int | None, size: tuple[int, int] | None, limits: ImageLimits, item: ItemRef
) -> MediaTooLargeError:
    shown = f"{size[0]:,} x {size[1]:,} = " if size else ""
    amount = f"{shown}{pixels:,} pixels" if pixels is not None else "too many pixels"
    return MediaTooLargeError(
        f"the image is {amount}; the limit (max_pixels) is {limits.max_pixels:,}.",
        limit="max_pixels",
        maximum=limits.max_pixels,
        actual=pixels,
        item=item,
    )


def _exif_transpose(im: Image.Image) -> Image.Image:
    try:
        out = ImageOps.exif_transpose(im)
    except Exception:  # malformed EXIF: treated as no orientation, deterministically
        return im
    return out if out is not None else im


def _to_rgb(im: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    if im.mode == "RGB":
        return im
    if im.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit grayscale PNG: Pillow's convert would clip at 255; scale instead.
        gray = np.asarray(im, dtype=np.float64) / 257.0
        im = Image.fromarray(np.clip(np.rint(gray), 0, 255).astype(np.uint8))  # 2-D uint8 -> mode "L"
    has_alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info
    if has_alpha:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return im.convert("RGB")
