"""Video decoding: evenly spaced frames by timestamp, limits (counted, not declared) and bad input."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

from modalities import video
from modalities.errors import CorruptMediaError, MediaTooLargeError, UnsupportedFormatError
from modalities.limits import VideoLimits
from modalities.video import VideoOptions
from tests.modalities import helpers as h

CODECS = [("mp4", "libx264"), ("mp4", "mpeg4"), ("webm", "libvpx"), ("webm", "libvpx-vp9")]


@pytest.mark.parametrize(("fmt", "codec"), CODECS)
def test_evenly_spaced_frames_with_timestamps(fmt: str, codec: str) -> None:
    data = h.av_video(fmt, codec, frames=24, fps=10, gop=5)
    decoded = video.decode(data, options=VideoOptions(num_frames=5), item=0)
    assert decoded.frames.shape == (5, 48, 64, 3) and decoded.frames.dtype == np.uint8
    assert [h.frame_index(f) for f in decoded.frames] == [0, 6, 11, 17, 23]
    np.testing.assert_allclose(decoded.timestamps, [0.0, 0.6, 1.1, 1.7, 2.3], atol=1e-6)
    assert decoded.duration == pytest.approx(2.4)
    assert decoded.frame_count == 24
    assert decoded.declared_fps == pytest.approx(10)
    assert decoded.source_fps == pytest.approx(10)
    assert decoded.sample_fps == pytest.approx(5 / 2.4)
    assert decoded.container == {"mp4": "isobmff", "webm": "ebml"}[fmt]
    assert decoded.nbytes == decoded.frames.nbytes + decoded.timestamps.nbytes


def reference_frames(data: bytes, picked: list[float]) -> list[np.ndarray]:
    """Decode every frame in order and keep those at the picked timestamps (seconds)."""
    with av.open(io.BytesIO(data)) as box:
        frames = {round(float(f.time), 6): f.to_ndarray(format="rgb24") for f in box.decode(video=0)}
    first = min(frames)
    return [frames[round(first + t, 6)] for t in picked]


@pytest.mark.parametrize(("fmt", "codec"), CODECS)
def test_seeking_to_keyframes_gives_the_same_frames_as_decoding_everything(
    fmt: str, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = h.av_video(fmt, codec, frames=60, fps=10, gop=4)
    seeks = []
    real_seek = av.container.InputContainer.seek

    def counting_seek(self, offset, **kwargs):
        seeks.append(offset)
        return real_seek(self, offset, **kwargs)

    monkeypatch.setattr(av.container.InputContainer, "seek", counting_seek)
    decoded = video.decode(data, options=VideoOptions(num_frames=7))
    assert len(seeks) > 3  # the keyframe shortcut was taken
    expected = reference_frames(data, list(decoded.timestamps))
    assert len(decoded.frames) == 7
    for got, want in zip(decoded.frames, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_fewer_frames_than_requested_returns_each_once() -> None:
    decoded = video.decode(h.av_video(frames=3), options=VideoOptions(num_frames=8))
    assert [h.frame_index(f) for f in decoded.frames] == [0, 1, 2]


def test_single_frame_video() -> None:
    decoded = video.decode(h.av_video(frames=1), options=VideoOptions(num_frames=4))
    assert len(decoded.frames) == 1 and decoded.timestamps.tolist() == [0.0]


def test_fps_sampling() -> None:
    data = h.av_video(frames=24, fps=10)
    decoded = video.decode(data, options=VideoOptions(num_frames=32, fps=2.0))
    assert len(decoded.frames) == 5  # round(2.4 s * 2 fps)
    capped = video.decode(data, options=VideoOptions(num_frames=3, fps=2.0))
    assert len(capped.frames) == 3


def test_frames_can_be_scaled_down() -> None:
    decoded = video.decode(h.av_video(width=320, height=240, frames=4), options=VideoOptions(max_frame_pixels=80 * 60))
    assert decoded.frames.shape[1:] == (60, 80, 3)


def non_seekable_webm(frames: int, fps: int = 10) -> bytes:
    """VP8 in WebM written as a live recorder would: no duration and no frame count in the header."""

    class Sink:
        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, chunk: bytes) -> int:
            self.data += bytes(chunk)
            return len(chunk)

    sink = Sink()
    with av.open(sink, "w", format="webm") as box:
        stream = box.add_stream("libvpx", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(h.video_frame(i, 32, 24), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return bytes(sink.data)


def test_missing_duration_is_measured_from_packets() -> None:
    data = non_seekable_webm(30)
    with av.open(io.BytesIO(data)) as box:
        assert box.duration is None and box.streams.video[0].frames == 0
    decoded = video.decode(data, options=VideoOptions(num_frames=4))
    assert decoded.duration == pytest.approx(3.0)
    assert decoded.frame_count == 30
    assert [h.frame_index(f) for f in decoded.frames] == [0, 10, 19, 29]


# ---- limits ---------------------------------------------------------------------------------------------------


def test_thousands_of_frames_are_counted_and_refused() -> None:
    data = h.av_video("mp4", "mpeg4", frames=3000, fps=1000, width=16, height=16)
    with pytest.raises(MediaTooLargeError) as info:
        video.decode(data, VideoLimits(max_frames=1000), item=6)
    assert (info.value.limit, info.value.maximum, info.value.actual, info.value.item) == ("max_frames", 1000, None, 6)
    assert video.decode(data, VideoLimits(max_frames=3000)).frame_count == 3000


def test_a_lying_frame_count_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    data = h.av_video(frames=24)
    monkeypatch.setattr(av.video.stream.VideoStream, "frames", property(lambda self: 1), raising=False)
    with av.open(io.BytesIO(data)) as box:
        assert box.streams.video[0].frames == 1  # the header now lies
    decoded = video.decode(data, options=VideoOptions(num_frames=3))
    assert decoded.frame_count == 24
    assert [h.frame_index(f) for f in decoded.frames] == [0, 11, 23]  # 11.5 rounds to the earlier frame


def test_too_long_video_is_refused_from_its_header() -> None:
    with pytest.raises(MediaTooLargeError) as info:
        video.decode(h.av_video(frames=30, fps=10), VideoLimits(max_seconds=2), item=1)
    assert (info.value.limit, info.value.actual) == ("max_seconds", pytest.approx(3.0))
    assert "claims to be 3.0 s" in str(info.value)


def test_too_long_video_without_a_duration_is_refused_while_demuxing() -> None:
    with pytest.raises(MediaTooLargeError) as info:
        video.decode(non_seekable_webm(30), VideoLimits(max_seconds=2), item=1)
    assert (info.value.limit, info.value.actual) == ("max_seconds", None)


def test_pixel_output_and_byte_limits() -> None:
    data = h.av_video(frames=4)
    with pytest.raises(MediaTooLargeError) as info:
        video.decode(data, VideoLimits(max_pixels=1000))
    assert (info.value.limit, info.value.actual) == ("max_pixels", 64 * 48)
    with pytest.raises(MediaTooLargeError) as info:
        video.decode(data, VideoLimits(max_output_bytes=64 * 48 * 3 * 3), VideoOptions(num_frames=4))
    assert (info.value.limit, info.value.actual) == ("max_output_bytes", 64 * 48 * 3 * 4)
    with pytest.raises(MediaTooLargeError) as info:
        video.decode(data, VideoLimits(max_bytes=100))
    assert (info.value.limit, info.value.actual) == ("max_bytes", len(data))


def test_asking_for_more_frames_than_allowed_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="max_sampled_frames"):
        video.decode(h.av_video(frames=2), VideoLimits(max_sampled_frames=4), VideoOptions(num_frames=5))


# ---- bad input ------------------------------------------------------------------------------------------------


def test_unsupported_codec() -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        video.decode(h.av_video("mp4", "mjpeg", frames=3), item=2)
    assert (info.value.code, info.value.item) == ("unsupported_codec", 2)
    assert "'mjpeg'" in str(info.value)


def test_no_video_stream_and_not_a_video() -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        video.decode(h.av_audio("mp4", "aac"), item=0)
    assert info.value.code == "no_stream"
    with pytest.raises(UnsupportedFormatError) as info:
        video.decode(h.encode_image(h.picture(), "PNG"), item=0)
    assert info.value.code == "unsupported_format"


def test_declared_type_must_match() -> None:
    webm = h.av_video("webm", "libvpx", frames=3)
    assert video.decode(webm, declared="video/webm").container == "ebml"
    with pytest.raises(UnsupportedFormatError) as info:
        video.decode(webm, declared="video/mp4", item=3)
    assert info.value.code == "format_mismatch"


@pytest.mark.parametrize("keep", [0.5, 40])
def test_truncated_mp4_is_corrupt(keep: float) -> None:
    data = h.av_video(frames=30)
    cut = int(len(data) * keep) if keep < 1 else int(keep)
    with pytest.raises(CorruptMediaError) as info:
        video.decode(data[:cut], item=4)
    assert info.value.item == 4


def test_truncated_webm_decodes_its_intact_part() -> None:
    data = h.av_video("webm", "libvpx", frames=30)
    decoded = video.decode(data[: len(data) // 2])
    assert 0 < decoded.frame_count < 30


def test_corrupt_and_empty_video() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(CorruptMediaError):
        video.decode(b"\x1a\x45\xdf\xa3" + rng.bytes(3000), item=0)
    with pytest.raises(CorruptMediaError):
        video.decode(b"\x00\x00\x00\x18ftypisom" + rng.bytes(3000), item=0)
    with pytest.raises(CorruptMediaError) as info:
        video.decode(b"", item=0)
    assert info.value.code == "empty_media"
