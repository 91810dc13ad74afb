"""Named limits on the media a request may carry, with defaults.

Limits only ever *refuse* media (with :class:`~modalities.errors.MediaTooLargeError` naming the field); they never
change what a successful decode returns, so they are not part of a media item's content identity. Settings that do
change the output (sample rate, frame count, EXIF policy) live in each module's ``...Options`` instead.

Each field name is what ``MediaTooLargeError.limit`` reports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MiB = 1024 * 1024


def _check_positive(limits: object) -> None:
    for field in dataclasses.fields(limits):  # type: ignore[arg-type]
        value = getattr(limits, field.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{type(limits).__name__}.{field.name} must be a positive number, got {value!r}")


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int = 20 * MiB  # encoded size of one image
    max_pixels: int = 7680 * 4320  # width * height as declared in the header (8K UHD); checked before decoding

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True, slots=True)
class AudioLimits:
    max_bytes: int = 25 * MiB  # encoded size of one clip
    max_seconds: float = 600.0  # duration, from the header when it has one and again while decoding
    max_sample_rate: int = 384_000  # source sample rate in Hz
    max_channels: int = 16  # source channel count

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_bytes: int = 64 * MiB  # encoded size of one video
    max_seconds: float = 600.0  # duration, from the header when it has one and from packet timestamps
    max_frames: int = 36_000  # frames in the stream, counted (never taken from the header)
    max_pixels: int = 3840 * 2160  # width * height of one frame (4K UHD)
    max_sampled_frames: int = 256  # frames a decode may return (VideoOptions.num_frames must not exceed it)
    max_output_bytes: int = 512 * MiB  # RGB bytes of the frames a decode returns, checked before decoding them

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """The limits of all three kinds, for callers that pass them around together."""

    image: ImageLimits = ImageLimits()  # limits for images
    audio: AudioLimits = AudioLimits()  # limits for audio clips
    video: VideoLimits = VideoLimits()  # limits for videos
