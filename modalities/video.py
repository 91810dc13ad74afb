"""Video: decode N evenly spaced RGB frames with limits, plus their timestamps; fingerprint the settings.

Containers: MP4 / MOV and WebM / Matroska through PyAV, with the sniffed demuxer forced. Codecs: :data:`CODECS`.

The stream's declared frame count is never used. Decoding is two passes over one opened container:

1. **Demux** (no decoding, cheap): read every packet of the video stream, collecting presentation timestamps and
   keyframe flags. This counts the frames and measures the duration, refusing ``max_frames`` / ``max_seconds`` as
   soon as they are passed; it works when the container declares no duration (MediaRecorder WebM).
2. **Decode**: pick the frames whose timestamps are nearest to ``num_frames`` evenly spaced times from the first to
   the last frame (both ends included, like Qwen2-VL's ``linspace`` over frame indices), then decode up to each
   one, seeking to its keyframe when that keyframe lies ahead of the decoder (so a long video with frequent
   keyframes is mostly skipped), and convert only the picked frames to RGB.

A header that declares a duration above ``max_seconds`` is refused before the demux pass.
"""

from __future__ import annotations

import bisect
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from modalities.errors import CorruptMediaError, ItemRef, MediaError, MediaTooLargeError, UnsupportedFormatError
from modalities.formats import identify
from modalities.identity import Fingerprint
from modalities.identity import fingerprint as _fingerprint
from modalities.limits import VideoLimits

DEFAULT_LIMITS = VideoLimits()

DECODER_VERSION = 1  # bump when decode() output changes for the same bytes and options
CONTAINERS = frozenset({"isobmff", "ebml"})
_AV_FORMAT = {"isobmff": "mp4", "ebml": "matroska"}  # forced demuxer per sniffed container
_LABEL = {"isobmff": "MP4", "ebml": "WebM"}
CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1", "mpeg4"})  # FFmpeg codec descriptor names


@dataclass(frozen=True, slots=True)
class VideoOptions:
    """Settings that change the decoded output (all of them go into the fingerprint)."""

    num_frames: int = 8  # frames to return (fewer if the video has fewer); the most when fps is set
    fps: float | None = None  # if set, sample at this rate instead: round(duration * fps) frames, 1..num_frames
    max_frame_pixels: int | None = None  # if set, frames are scaled down (aspect kept) to at most this many pixels

    def __post_init__(self) -> None:
        if isinstance(self.num_frames, bool) or not isinstance(self.num_frames, int) or self.num_frames <= 0:
            raise ValueError(f"VideoOptions.num_frames must be a positive integer, got {self.num_frames!r}")
        if self.fps is not None and not (isinstance(self.fps, int | float) and 0 < self.fps < math.inf):
            raise ValueError(f"VideoOptions.fps must be a positive number or None, got {self.fps!r}")
        cap = self.max_frame_pixels
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
            raise ValueError(f"VideoOptions.max_frame_pixels must be a positive integer or None, got {cap!r}")

    def settings(self) -> dict[str, object]:
        return {
            "decoder": f"modalities.video/{DECODER_VERSION}",
            "sampling": "linspace-first-last-nearest",
            "num_frames": self.num_frames,
            "fps": self.fps,
            "max_frame_pixels": self.max_frame_pixels,
            "mode": "RGB",
        }


@dataclass(frozen=True, slots=True)
class DecodedVideo:
    frames: np.ndarray  # uint8 [n, H, W, 3], RGB, in presentation order
    timestamps: np.ndarray  # float64 [n], seconds from the first frame of the stream
    duration: float  # seconds from the first frame's start to the last frame's end, from packet timestamps
    frame_count: int  # frames in the stream, counted while demuxing
    declared_fps: float | None  # the stream's average frame rate as its header states it, if any
    container: str  # sniffed container: "isobmff" or "ebml"
    codec: str  # e.g. "h264", "vp9"

    @property
    def source_fps(self) -> float:
        """Measured frame rate: frames counted / duration."""
        return self.frame_count / self.duration if self.duration > 0 else 0.0

    @property
    def sample_fps(self) -> float:
        """Rate of the returned frames over the whole video (what Qwen2-VL calls fps of the sampled frames)."""
        return len(self.frames) / self.duration if self.duration > 0 else 0.0

    @property
    def nbytes(self) -> int:
        """Memory held by the frames (what a media store charges for this item)."""
        return int(self.frames.nbytes + self.timestamps.nbytes)


def fingerprint(
    processor: str, options: VideoOptions = VideoOptions(), processor_settings: Mapping[str, object] | None = None
) -> Fingerprint:
    """Fingerprint of ``options`` followed by ``processor`` (e.g. ``"Qwen2VLVideoProcessor"``) and its settings."""
    return _fingerprint("video", processor, {"decode": options.settings(), "processor": dict(processor_settings or {})})


def decode(
    data: bytes,
    limits: VideoLimits = DEFAULT_LIMITS,
    options: VideoOptions = VideoOptions(),
    *,
    declared: str | None = None,
    item: ItemRef = None,
) -> DecodedVideo:
    """Decode evenly spaced frames of one video.

    Args:
        data: the encoded file.
        limits: bytes, seconds, frames, pixels per frame, frames returned.
        options: how many frames, at what rate, at what size.
        declared: the MIME type the sender gave ("video/mp4", "video/webm"), or None to trust the bytes.
        item: index or name of the video, carried by every error.

    Raises:
        CorruptMediaError: empty, truncated or undecodable data, or no frame at all.
        UnsupportedFormatError: not MP4 / WebM, a codec outside :data:`CODECS`, no video stream, or ``declared``
            does not match.
        MediaTooLargeError: ``max_bytes``, ``max_seconds`` (declared, or measured while demuxing), ``max_frames``
            (counted), ``max_pixels`` (per frame) or ``max_output_bytes`` (the frames to return) exceeded.
        ValueError: ``options.num_frames`` is above ``limits.max_sampled_frames`` (a configuration error).
    """
    if options.num_frames > limits.max_sampled_frames:
        raise ValueError(
            f"VideoOptions.num_frames={options.num_frames} exceeds VideoLimits.max_sampled_frames="
            f"{limits.max_sampled_frames}"
        )
    if len(data) > limits.max_bytes:
        raise _too_large(
            f"the video is {len(data):,} bytes; the limit (max_bytes) is {limits.max_bytes:,}.",
            "max_bytes",
            limits.max_bytes,
            len(data),
            item,
        )
    container = identify(data, declared, CONTAINERS, "video", item)
    label = _LABEL[container]
    try:
        box = av.open(io.BytesIO(data), format=_AV_FORMAT[container])
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise CorruptMediaError(f"the {label} video is truncated or corrupt.", item=item) from exc
    with box:
        stream = _video_stream(box, label, limits, item)
        try:
            index = _demux(box, stream, limits, item)
            if index.count == 0:
                raise CorruptMediaError(f"the {label} video contains no frames.", item=item)
            wanted = _pick(index, _frame_target(index, options))
            _check_output(len(wanted), stream, options, limits, item)
            frames, pts = _decode_picked(box, stream, index, wanted, options, limits, item)
        except MediaError:
            raise
        except (av.error.FFmpegError, ValueError, OSError) as exc:
            raise CorruptMediaError(f"the {label} video is truncated or corrupt.", item=item) from exc
    if not frames:
        raise CorruptMediaError(f"no frame of the {label} video could be decoded.", item=item)
    rate = stream.average_rate
    return DecodedVideo(
        frames=np.stack(frames),
        timestamps=np.array([float((p - index.first) * index.time_base) for p in pts], dtype=np.float64),
        duration=index.duration,
        frame_count=index.count,
        declared_fps=float(rate) if rate else None,
        container=container,
        codec=stream.codec_context.codec.canonical_name,
    )


# ---------------------------------------------------------------------------------------------------------------
# pass 1: demux
# ---------------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Index:
    pts: list[int]  # presentation timestamps of all frames, sorted (stream time base)
    keyframes: list[int]  # presentation timestamps of keyframes, sorted
    time_base: Fraction  # seconds per timestamp unit
    first: int  # smallest pts
    duration: float  # seconds, first frame start to last frame end
    count: int  # frames counted


def _video_stream(box: av.container.InputContainer, label: str, limits: VideoLimits, item: ItemRef) -> av.VideoStream:
    if not box.streams.video:
        raise UnsupportedFormatError(f"the {label} file has no video stream.", item=item, code="no_stream")
    stream = box.streams.video[0]
    ctx = stream.codec_context
    codec = ctx.codec.canonical_name if ctx is not None and ctx.codec is not None else "unknown"
    if codec not in CODECS:
        raise UnsupportedFormatError(
            f"the video codec {codec!r} is not supported (supported: {', '.join(sorted(CODECS))}).",
            item=item,
            code="unsupported_codec",
        )
    _check_pixels(ctx.width, ctx.height, limits, item)
    claimed = None
    if stream.duration is not None and stream.time_base is not None:
        claimed = float(stream.duration * stream.time_base)
    elif box.duration is not None:
        claimed = box.duration / av.time_base
    if claimed is not None and claimed > limits.max_seconds:
        raise _too_large(
            f"the video claims to be {claimed:,.1f} s long; the limit (max_seconds) is {limits.max_seconds:g} s.",
            "max_seconds",
            limits.max_seconds,
            claimed,
            item,
        )
    return stream


def _demux(box: av.container.InputContainer, stream: av.VideoStream, limits: VideoLimits, item: ItemRef) -> _Index:
    tb = stream.time_base or Fraction(1, 1000)
    max_ticks = limits.max_seconds / tb
    pts, keys, first, last_len = [], [], None, 0
    for packet in box.demux(stream):
        stamp = packet.pts if packet.pts is not None else packet.dts
        if stamp is None:
            if packet.size:
                raise CorruptMediaError("the video has frames without timestamps.", item=item)
            continue  # the flush packet at the end
        first = stamp if first is None else min(first, stamp)
        if stamp - first > max_ticks:
            detail = f"the video is longer than the limit (max_seconds) of {limits.max_seconds:g} s."
            raise _too_large(detail, "max_seconds", limits.max_seconds, None, item)
        pts.append(stamp)
        if len(pts) > limits.max_frames:
            detail = f"the video has more than {limits.max_frames:,} frames, the limit (max_frames)."
            raise _too_large(detail, "max_frames", limits.max_frames, None, item)
        if packet.is_keyframe:
            keys.append(stamp)
        last_len = packet.duration or 0
    pts.sort()
    keys.sort()
    if not pts:
        return _Index([], [], tb, 0, 0.0, 0)
    if not last_len:
        gaps = np.diff(pts)
        last_len = int(np.median(gaps)) if len(gaps) else 0
    duration = float((pts[-1] - pts[0] + last_len) * tb)
    return _Index(pts, keys or [pts[0]], tb, pts[0], duration, len(pts))


# ---------------------------------------------------------------------------------------------------------------
# pass 2: pick and decode
# ---------------------------------------------------------------------------------------------------------------


def _frame_target(index: _Index, options: VideoOptions) -> int:
    if options.fps is None:
        return options.num_frames
    return max(1, min(options.num_frames, round(index.duration * options.fps)))


def _pick(index: _Index, n: int) -> list[int]:
    """Timestamps of the frames nearest to ``n`` evenly spaced times from the first to the last frame."""
    pts = index.pts
    chosen = []
    for t in np.linspace(pts[0], pts[-1], n):
        i = bisect.bisect_left(pts, t)
        if i == len(pts) or (i > 0 and t - pts[i - 1] <= pts[i] - t):
            i -= 1
        if not chosen or pts[i] != chosen[-1]:
            chosen.append(pts[i])
    return chosen


def _decode_picked(
    box: av.container.InputContainer,
    stream: av.VideoStream,
    index: _Index,
    wanted: list[int],
    options: VideoOptions,
    limits: VideoLimits,
    item: ItemRef,
) -> tuple[list[np.ndarray], list[int]]:
    """Decode up to each wanted timestamp; each wanted one is served by the first frame at or after it."""
    frames: list[np.ndarray] = []
    taken: list[int] = []
    size = None  # (width, height) of the returned frames, fixed by the first one (resolution may change mid-stream)
    position = None  # pts of the last decoded frame
    last = None  # the last decoded frame, to serve wanted timestamps past the end of what decodes
    sought = None  # the keyframe last sought to, while no frame has been taken since
    i = 0
    while i < len(wanted):
        key = _keyframe_before(index, wanted[i])
        if position is None or position < key:
            if sought == key:
                break  # seeking there again would decode the same frames again
            box.seek(key, stream=stream, backward=True, any_frame=False)
            sought = key
        progressed = False
        for frame in box.decode(stream):
            if frame.pts is None:
                continue
            progressed, position, last = True, frame.pts, frame
            while i < len(wanted) and frame.pts >= wanted[i]:
                if not taken or taken[-1] != frame.pts:
                    size = size or _output_size(frame.width, frame.height, options)
                    frames.append(_to_rgb(frame, size, limits, item))
                    taken.append(frame.pts)
                    sought = None
                i += 1
            if i == len(wanted) or _keyframe_before(index, wanted[i]) > position:
                break  # done, or a keyframe lies between here and the next wanted frame: seek to it
        if not progressed:
            break  # the decoder gives nothing more
    if i < len(wanted) and last is not None and (not taken or taken[-1] != last.pts):
        size = size or _output_size(last.width, last.height, options)
        frames.append(_to_rgb(last, size, limits, item))
        taken.append(last.pts)
    return frames, taken


def _keyframe_before(index: _Index, stamp: int) -> int:
    """The last keyframe at or before ``stamp`` (the first keyframe if there is none)."""
    return index.keyframes[max(0, bisect.bisect_right(index.keyframes, stamp) - 1)]


def _to_rgb(frame: av.VideoFrame, size: tuple[int, int], limits: VideoLimits, item: ItemRef) -> np.ndarray:
    _check_pixels(frame.width, frame.height, limits, item)
    width, height = size
    if (width, height) != (frame.width, frame.height):
        return frame.to_ndarray(format="rgb24", width=width, height=height, interpolation="AREA")
    return frame.to_ndarray(format="rgb24")


def _output_size(width: int, height: int, options: VideoOptions) -> tuple[int, int]:
    cap = options.max_frame_pixels
    if cap is None or width * height <= cap:
        return width, height
    scale = math.sqrt(cap / (width * height))
    return max(1, int(width * scale)), max(1, int(height * scale))


def _check_output(n: int, stream: av.VideoStream, options: VideoOptions, limits: VideoLimits, item: ItemRef) -> None:
    width, height = _output_size(stream.codec_context.width, stream.codec_context.height, options)
    size = n * width * height * 3
    if size > limits.max_output_bytes:
        raise _too_large(
            f"{n} frames of {width:,} x {height:,} would take {size:,} bytes; "
            f"the limit (max_output_bytes) is {limits.max_output_bytes:,}.",
            "max_output_bytes",
            limits.max_output_bytes,
            size,
            item,
        )


def _check_pixels(width: int, height: int, limits: VideoLimits, item: ItemRef) -> None:
    if width * height > limits.max_pixels:
        raise MediaTooLargeError(
            f"the video's frames are {width:,} x {height:,} = {width * height:,} pixels; "
            f"the limit (max_pixels) is {limits.max_pixels:,}.",
            limit="max_pixels",
            maximum=limits.max_pixels,
            actual=width * height,
            item=item,
        )


def _too_large(detail: str, limit: str, maximum: float, actual: float | None, item: ItemRef) -> MediaTooLargeError:
    return MediaTooLargeError(detail, limit=limit, maximum=maximum, actual=actual, item=item)
