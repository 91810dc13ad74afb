"""Audio decoding: containers and codecs, mono + resampling, limits (from the header first) and bad input."""

from __future__ import annotations

import io
import time
from fractions import Fraction

import av
import numpy as np
import pytest
import soundfile

from modalities import audio
from modalities.audio import AudioOptions
from modalities.errors import CorruptMediaError, MediaTooLargeError, UnsupportedFormatError
from modalities.limits import AudioLimits
from tests.modalities import helpers as h

TEN_HOURS = 10 * 3600


def dominant_frequency(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


SOUNDFILE_CASES = {
    "wav": lambda: h.sf_audio("WAV", "PCM_16", rate=44_100, channels=2),
    "wav-float": lambda: h.sf_audio("WAV", "FLOAT", rate=22_050),
    "flac": lambda: h.sf_audio("FLAC", rate=44_100, channels=2),
    "ogg-vorbis": lambda: h.sf_audio("OGG", "VORBIS", rate=32_000),
    "ogg-opus": lambda: h.sf_audio("OGG", "OPUS", rate=48_000, channels=2),
    "mp3": lambda: h.sf_audio("MP3", rate=44_100),
}
AV_CASES = {
    "m4a-aac": lambda: h.av_audio("ipod", "aac"),
    "mp4-alac": lambda: h.av_audio("mp4", "alac", rate=44_100),
    "webm-opus": lambda: h.av_audio("webm", "libopus"),
    "mkv-flac": lambda: h.av_audio("matroska", "flac", layout="mono"),
    "adts-aac": lambda: h.av_audio("adts", "aac", rate=24_000, layout="mono"),
}
CONTAINER = {"wav": "wav", "flac": "flac", "ogg": "ogg", "mp3": "mp3", "m4a": "isobmff", "mp4": "isobmff",
             "webm": "ebml", "mkv": "ebml", "adts": "aac"}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SOUNDFILE_CASES) + sorted(AV_CASES))
def test_each_container_decodes_to_mono_16k(case: str) -> None:
    data = {**SOUNDFILE_CASES, **AV_CASES}[case]()
    decoded = audio.decode(data, item=0)
    assert decoded.container == CONTAINER[case.split("-")[0]]
    assert decoded.sample_rate == 16_000
    assert decoded.samples.dtype == np.float32 and decoded.samples.ndim == 1
    # 0.5 s of tone; lossy codecs add up to ~one frame of priming / padding
    assert 0.45 <= decoded.duration <= 0.56, decoded.duration
    assert abs(dominant_frequency(decoded.samples, 16_000) - 440) < 5
    assert decoded.nbytes == decoded.samples.nbytes


def test_channels_are_averaged() -> None:
    data = h.sf_audio("WAV", "FLOAT", rate=16_000, channels=2)  # amplitudes 0.5 and 0.25
    decoded = audio.decode(data)
    assert decoded.source_channels == 2
    expected = h.tone(0.5, 16_000)[:, 0] * 0.75
    np.testing.assert_allclose(decoded.samples, expected, atol=1e-6)


@pytest.mark.parametrize("rate", [8_000, 16_000, 22_050, 24_000])
def test_resampled_to_the_requested_rate(rate: int) -> None:
    decoded = audio.decode(h.sf_audio("WAV", rate=44_100), options=AudioOptions(sample_rate=rate))
    assert decoded.sample_rate == rate
    assert decoded.source_rate == 44_100
    assert len(decoded.samples) == -(-int(0.5 * 44_100) * rate // 44_100)
    assert abs(dominant_frequency(decoded.samples, rate) - 440) < 5


def test_declared_format_must_match() -> None:
    wav = h.sf_audio("WAV")
    assert audio.decode(wav, declared="wav").container == "wav"
    assert audio.decode(wav, declared="audio/x-wav").container == "wav"
    with pytest.raises(UnsupportedFormatError) as info:
        audio.decode(wav, declared="mp3", item=1)
    assert info.value.code == "format_mismatch"
    with pytest.raises(UnsupportedFormatError) as info:
        audio.decode(wav, declared="image/png", item=1)
    assert info.value.code == "unsupported_format"
    with pytest.raises(UnsupportedFormatError):
        audio.decode(h.encode_image(h.picture(), "PNG"), item=1)


# ---- limits ---------------------------------------------------------------------------------------------------


def test_wav_header_claiming_ten_hours_is_refused_before_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    data = h.wav_bytes(h.pcm16(0.1), data_size=TEN_HOURS * 16_000 * 2)
    assert len(data) < 4000
    monkeypatch.setattr(soundfile, "SoundFile", lambda *a, **k: pytest.fail("opened the stream"))
    start = time.perf_counter()
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(data, item=4)
    assert time.perf_counter() - start < 0.5  # decoding ten hours would take far longer (and ~2 GB)
    assert (info.value.limit, info.value.actual, info.value.item) == ("max_seconds", TEN_HOURS, 4)
    assert "claims to be 36,000.0 s" in str(info.value)


def flac_claiming(data: bytes, total_samples: int) -> bytes:
    """Rewrite the 36-bit total-samples field of a FLAC file's STREAMINFO block."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO comes first
    field = 8 + 10  # "fLaC" + block header, then 10 bytes before rate / channels / bits / total
    packed = int.from_bytes(data[field : field + 8], "big")
    packed = (packed & ~((1 << 36) - 1)) | total_samples
    return data[:field] + packed.to_bytes(8, "big") + data[field + 8 :]


def test_flac_header_claiming_ten_hours_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    data = flac_claiming(h.sf_audio("FLAC", seconds=0.2), TEN_HOURS * 16_000)
    monkeypatch.setattr(soundfile.SoundFile, "read", lambda *a, **k: pytest.fail("decoded samples"))
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(data, item=0)
    assert info.value.actual == pytest.approx(TEN_HOURS)


@pytest.mark.parametrize(
    "make",
    [
        lambda: h.sf_audio("WAV", seconds=3),
        lambda: h.sf_audio("FLAC", seconds=3),
        lambda: h.sf_audio("OGG", "VORBIS", seconds=3),
        lambda: h.av_audio("mp4", "aac", seconds=3),
        lambda: h.av_audio("webm", "libopus", seconds=3),
    ],
    ids=["wav", "flac", "ogg", "m4a", "webm"],
)
def test_too_long_audio(make) -> None:
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(make(), AudioLimits(max_seconds=2), item=2)
    assert (info.value.limit, info.value.maximum) == ("max_seconds", 2)
    assert info.value.actual == pytest.approx(3, abs=0.05)


def webm_without_duration(seconds: float) -> bytes:
    """Opus in WebM written to a non-seekable sink, as MediaRecorder does: the header has no duration."""

    class Sink:
        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, chunk: bytes) -> int:
            self.data += bytes(chunk)
            return len(chunk)

    sink, rate = Sink(), 48_000
    x = h.tone(seconds, rate)[:, 0]
    with av.open(sink, "w", format="webm") as box:
        stream = box.add_stream("libopus", rate=rate, layout="mono")
        for start in range(0, len(x), 960):
            chunk = (x[start : start + 960] * 32767).astype(np.int16)[None, :]
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return bytes(sink.data)


def test_duration_is_enforced_while_decoding_when_the_header_has_none() -> None:
    data = webm_without_duration(3.0)
    with av.open(io.BytesIO(data)) as box:
        assert box.duration is None and box.streams.audio[0].duration is None
    assert audio.decode(data).duration == pytest.approx(3.0, abs=0.05)
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(data, AudioLimits(max_seconds=1), item=1)
    assert (info.value.limit, info.value.actual) == ("max_seconds", None)


def test_sample_rate_and_channel_limits() -> None:
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(h.sf_audio("WAV", rate=48_000), AudioLimits(max_sample_rate=44_100))
    assert (info.value.limit, info.value.actual) == ("max_sample_rate", 48_000)
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(h.sf_audio("WAV", channels=3), AudioLimits(max_channels=2))
    assert (info.value.limit, info.value.actual) == ("max_channels", 3)
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(h.av_audio("mp4", "aac"), AudioLimits(max_channels=1))
    assert info.value.limit == "max_channels"


def test_byte_limit() -> None:
    data = h.sf_audio("WAV")
    with pytest.raises(MediaTooLargeError) as info:
        audio.decode(data, AudioLimits(max_bytes=1000), item=0)
    assert (info.value.limit, info.value.actual) == ("max_bytes", len(data))


# ---- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "keep"),
    [
        (lambda: h.sf_audio("WAV"), 0.5),
        (lambda: h.sf_audio("WAV"), 30),
        (lambda: h.sf_audio("FLAC", seconds=2), 0.5),
        (lambda: h.sf_audio("FLAC"), 20),
        (lambda: h.sf_audio("OGG", "VORBIS", seconds=2), 0.5),
        (lambda: h.sf_audio("MP3"), 100),
        (lambda: h.av_audio("mp4", "aac", seconds=2), 0.5),
        (lambda: h.av_audio("webm", "libopus"), 100),
    ],
    ids=["wav-half", "wav-header", "flac-half", "flac-header", "ogg-half", "mp3-header", "m4a-half", "webm-header"],
)
def test_truncated_audio_is_corrupt(make, keep: float) -> None:
    data = make()
    cut = int(len(data) * keep) if keep < 1 else int(keep)
    with pytest.raises(CorruptMediaError) as info:
        audio.decode(data[:cut], item=3)
    assert (info.value.item, info.value.code) == (3, "corrupt_media")


def test_truncated_wav_names_what_is_missing() -> None:
    data = h.wav_bytes(h.pcm16(0.1))
    with pytest.raises(CorruptMediaError, match="announces 3,200 bytes of samples but only 1,600 are present"):
        audio.decode(data[: len(data) - 1600])


def test_corrupt_and_empty_audio() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(CorruptMediaError):
        audio.decode(b"fLaC" + rng.bytes(2000), item=0)
    with pytest.raises(CorruptMediaError):
        audio.decode(b"OggS" + rng.bytes(2000), item=0)
    with pytest.raises(CorruptMediaError) as info:
        audio.decode(b"", item=0)
    assert info.value.code == "empty_media"
    with pytest.raises(CorruptMediaError, match="no samples"):
        audio.decode(h.wav_bytes(b""), item=0)


def test_non_finite_samples_are_corrupt() -> None:
    x = h.tone(0.1)
    x[10, 0] = np.nan
    buf = io.BytesIO()
    soundfile.write(buf, x, 16_000, format="WAV", subtype="FLOAT")
    with pytest.raises(CorruptMediaError, match="NaN"):
        audio.decode(buf.getvalue(), item=0)


def test_unsupported_codecs() -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        audio.decode(h.wav_bytes(h.pcm16(0.1), tag=0x55), item=0)  # MP3 inside WAV
    assert info.value.code == "unsupported_codec"
    with pytest.raises(UnsupportedFormatError) as info:
        audio.decode(h.av_audio("mp4", "ac3"), item=0)
    assert info.value.code == "unsupported_codec"
    assert "'ac3'" in str(info.value)


def test_a_video_without_audio_has_no_stream() -> None:
    with pytest.raises(UnsupportedFormatError) as info:
        audio.decode(h.av_video("mp4", "libx264", frames=3), item=0)
    assert info.value.code == "no_stream"
