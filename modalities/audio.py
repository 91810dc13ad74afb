"""Audio: decode to mono float32 at a requested sample rate, with limits; fingerprint the settings.

Decoders: WAV, FLAC, Ogg (Vorbis, Opus) and MP3 through soundfile (libsndfile); M4A/MP4 (AAC, ALAC, MP3), WebM /
Matroska (Opus, Vorbis, ...) and raw ADTS AAC through PyAV, which is given the sniffed container so FFmpeg never
probes for other formats. Channels are averaged to mono; the result is resampled with
:func:`modalities.resample.resample` (a Kaiser-windowed sinc), the same resampler for every container.

Duration is checked three ways, cheapest first: for WAV by parsing the RIFF header (libsndfile silently clamps a
``data`` chunk size that exceeds the file, so a header claiming ten hours is refused here, before any audio is
read); from the decoder's header (FLAC's sample count, Ogg's last granule, MP4's duration), before decoding; and,
for PyAV containers, while decoding, so a stream without a duration (MediaRecorder WebM) or with a false one stops
at the limit. libsndfile never reads past the length its header gave, so the header check bounds its work.

Truncation: a WAV whose ``data`` chunk is cut short, and FLAC / Vorbis / M4A that fail to decode, raise
:class:`CorruptMediaError`. MP3 and Opus decoders resync past damage and return what they can; a cut MP3 or Opus
file decodes to its intact part.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass

import av
import numpy as np
import soundfile

from modalities import resample as _resample
from modalities.errors import (
    CorruptMediaError,
    ItemRef,
    MediaError,
    MediaTooLargeError,
    UnsupportedFormatError,
)
from modalities.formats import identify
from modalities.identity import Fingerprint
from modalities.identity import fingerprint as _fingerprint
from modalities.limits import AudioLimits

DEFAULT_LIMITS = AudioLimits()

DECODER_VERSION = 1  # bump when decode() output changes for the same bytes and options
CONTAINERS = frozenset({"wav", "flac", "ogg", "mp3", "isobmff", "ebml", "aac"})
_SOUNDFILE = frozenset({"wav", "flac", "ogg", "mp3"})
_AV_FORMAT = {"isobmff": "mp4", "ebml": "matroska", "aac": "aac"}  # forced demuxer per sniffed container
# Audio codecs accepted inside PyAV containers (FFmpeg codec descriptor names).
AV_CODECS = frozenset({"aac", "mp3", "opus", "vorbis", "flac", "alac", "pcm_s16le", "pcm_s24le", "pcm_f32le"})
# WAV format tags accepted: PCM, IEEE float, A-law, mu-law (and the same inside WAVE_FORMAT_EXTENSIBLE).
_WAV_TAGS = {1: "PCM", 3: "IEEE float", 6: "A-law", 7: "mu-law"}
_WAV_EXTENSIBLE = 0xFFFE
_BLOCK = 1 << 16  # frames per soundfile read


@dataclass(frozen=True, slots=True)
class AudioOptions:
    """Settings that change the decoded output (all of them go into the fingerprint)."""

    sample_rate: int = 16_000  # output sample rate in Hz

    def __post_init__(self) -> None:
        if isinstance(self.sample_rate, bool) or not isinstance(self.sample_rate, int) or self.sample_rate <= 0:
            raise ValueError(f"AudioOptions.sample_rate must be a positive integer, got {self.sample_rate!r}")

    def settings(self) -> dict[str, object]:
        return {
            "decoder": f"modalities.audio/{DECODER_VERSION}",
            "resampler": f"kaiser-sinc/{_resample.VERSION}",
            "channels": "mean",
            "sample_rate": self.sample_rate,
        }


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    samples: np.ndarray  # float32 [n], mono, at sample_rate
    sample_rate: int  # Hz, as requested in AudioOptions
    source_rate: int  # Hz, of the encoded stream
    source_channels: int  # channels of the encoded stream (averaged into one)
    container: str  # sniffed container, e.g. "wav", "isobmff"
    codec: str  # e.g. "PCM_16", "VORBIS", "aac", "opus"

    @property
    def duration(self) -> float:
        """Seconds of audio returned."""
        return len(self.samples) / self.sample_rate

    @property
    def nbytes(self) -> int:
        """Memory held by the samples (what a media store charges for this item)."""
        return int(self.samples.nbytes)


def fingerprint(
    processor: str, options: AudioOptions = AudioOptions(), processor_settings: Mapping[str, object] | None = None
) -> Fingerprint:
    """Fingerprint of ``options`` followed by ``processor`` (e.g. ``"WhisperFeatureExtractor"``) and its settings."""
    return _fingerprint("audio", processor, {"decode": options.settings(), "processor": dict(processor_settings or {})})


def decode(
    data: bytes,
    limits: AudioLimits = DEFAULT_LIMITS,
    options: AudioOptions = AudioOptions(),
    *,
    declared: str | None = None,
    item: ItemRef = None,
) -> DecodedAudio:
    """Decode one audio clip to mono float32 at ``options.sample_rate``.

    Args:
        data: the encoded file.
        limits: bytes, seconds, source sample rate and channels allowed.
        options: output settings.
        declared: the MIME type or format name the sender gave ("audio/wav", "mp3", ...), or None to trust the bytes.
        item: index or name of the clip, carried by every error.

    Raises:
        CorruptMediaError: empty, truncated or undecodable data, no samples at all, or NaN / infinite samples.
        UnsupportedFormatError: not a supported container or codec, no audio stream, or ``declared`` does not match.
        MediaTooLargeError: ``max_bytes``, ``max_seconds`` (from the header when possible, then while decoding),
            ``max_sample_rate`` or ``max_channels`` exceeded.
    """
    _check_bytes(data, limits, item)
    container = identify(data, declared, CONTAINERS, "audio", item)
    if container in _SOUNDFILE:
        mono, rate, channels, codec = _decode_soundfile(data, container, limits, item)
    else:
        mono, rate, channels, codec = _decode_av(data, container, limits, item)
    if len(mono) == 0:
        raise CorruptMediaError("the audio contains no samples.", item=item)
    if not np.isfinite(mono).all():  # float WAV / FLAC can carry NaN or infinity
        raise CorruptMediaError("the audio contains invalid (NaN or infinite) samples.", item=item)
    samples = _resample.resample(mono, rate, options.sample_rate)
    return DecodedAudio(
        samples=samples,
        sample_rate=options.sample_rate,
        source_rate=rate,
        source_channels=channels,
        container=container,
        codec=codec,
    )


# ---------------------------------------------------------------------------------------------------------------
# checks shared by both decoders
# ---------------------------------------------------------------------------------------------------------------


def _check_bytes(data: bytes, limits: AudioLimits, item: ItemRef) -> None:
    if len(data) > limits.max_bytes:
        raise MediaTooLargeError(
            f"the audio is {len(data):,} bytes; the limit (max_bytes) is {limits.max_bytes:,}.",
            limit="max_bytes",
            maximum=limits.max_bytes,
            actual=len(data),
            item=item,
        )


def _too_long(seconds: float | None, limits: AudioLimits, item: ItemRef, *, claimed: bool) -> MediaTooLargeError:
    if seconds is None:
        detail = f"the audio is longer than the limit (max_seconds) of {limits.max_seconds:g} s."
    else:
        verb = "claims to be" if claimed else "is"
        detail = f"the audio {verb} {seconds:,.1f} s long; the limit (max_seconds) is {limits.max_seconds:g} s."
    return MediaTooLargeError(detail, limit="max_seconds", maximum=limits.max_seconds, actual=seconds, item=item)


def _check_stream(rate: int, channels: int, limits: AudioLimits, item: ItemRef) -> None:
    if rate <= 0 or channels <= 0:
        raise CorruptMediaError(f"the audio header is invalid ({rate} Hz, {channels} channels).", item=item)
    if rate > limits.max_sample_rate:
        raise MediaTooLargeError(
            f"the audio's sample rate is {rate:,} Hz; the limit (max_sample_rate) is {limits.max_sample_rate:,} Hz.",
            limit="max_sample_rate",
            maximum=limits.max_sample_rate,
            actual=rate,
            item=item,
        )
    if channels > limits.max_channels:
        raise MediaTooLargeError(
            f"the audio has {channels} channels; the limit (max_channels) is {limits.max_channels}.",
            limit="max_channels",
            maximum=limits.max_channels,
            actual=channels,
            item=item,
        )


# ---------------------------------------------------------------------------------------------------------------
# soundfile: WAV, FLAC, Ogg, MP3
# ---------------------------------------------------------------------------------------------------------------


def _decode_soundfile(
    data: bytes, container: str, limits: AudioLimits, item: ItemRef
) -> tuple[np.ndarray, int, int, str]:
    if container == "wav":
        _check_wav_header(data, limits, item)
    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.SoundFileError, RuntimeError) as exc:
        raise CorruptMediaError(f"the {container.upper()} audio is truncated or corrupt.", item=item) from exc
    with f:
        rate, channels = int(f.samplerate), int(f.channels)
        _check_stream(rate, channels, limits, item)
        if f.frames > limits.max_seconds * rate:
            raise _too_long(f.frames / rate, limits, item, claimed=True)
        # soundfile never reads past f.frames, so the check above bounds the work; this budget is defense in depth.
        budget = int(limits.max_seconds * rate)
        blocks, total = [], 0
        try:
            while True:
                block = f.read(min(_BLOCK, budget - total + 1), dtype="float32", always_2d=True)
                if len(block) == 0:
                    break
                total += len(block)
                if total > budget:
                    raise _too_long(None, limits, item, claimed=False)
                blocks.append(block.mean(axis=1, dtype=np.float32))
        except (soundfile.SoundFileError, RuntimeError) as exc:
            raise CorruptMediaError(f"the {container.upper()} audio is truncated or corrupt.", item=item) from exc
        codec = str(f.subtype)
    mono = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    return mono, rate, channels, codec


def _check_wav_header(data: bytes, limits: AudioLimits, item: ItemRef) -> None:
    """Refuse, from the RIFF header alone, unsupported WAV codecs, over-long claims and a cut ``data`` chunk.

    Headers this parser does not understand are left to libsndfile.
    """
    order = "big" if data[:4] == b"RIFX" else "little"
    pos, fmt = 12, None
    for _ in range(1000):  # bounded: a file of many tiny chunks is left to libsndfile
        if pos + 8 > len(data):
            return
        chunk, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], order)
        if chunk == b"fmt ":
            fmt = data[pos + 8 : pos + 8 + min(size, 40)]
            _check_wav_codec(fmt, order, item)
        elif chunk == b"data":
            if fmt is None or len(fmt) < 16:
                return
            byte_rate = int.from_bytes(fmt[8:12], order)
            if size in (0, 0xFFFFFFFF) or byte_rate == 0:  # streaming writers leave the size unset
                return
            if size / byte_rate > limits.max_seconds:
                raise _too_long(size / byte_rate, limits, item, claimed=True)
            present = len(data) - (pos + 8)
            if size > present:
                raise CorruptMediaError(
                    f"the WAV audio is truncated: its header announces {size:,} bytes of samples "
                    f"but only {present:,} are present.",
                    item=item,
                )
            return
        pos += 8 + size + (size & 1)


def _check_wav_codec(fmt: bytes, order: str, item: ItemRef) -> None:
    if len(fmt) < 2:
        return
    tag = int.from_bytes(fmt[0:2], order)
    if tag == _WAV_EXTENSIBLE and len(fmt) >= 26:
        tag = int.from_bytes(fmt[24:26], order)  # first two bytes of the SubFormat GUID
    if tag not in _WAV_TAGS:
        raise UnsupportedFormatError(
            f"the WAV audio uses codec 0x{tag:04x}, which is not supported "
            f"(supported: {', '.join(_WAV_TAGS.values())}).",
            item=item,
            code="unsupported_codec",
        )


# ---------------------------------------------------------------------------------------------------------------
# PyAV: M4A / MP4, WebM / Matroska, ADTS AAC
# ---------------------------------------------------------------------------------------------------------------


def _decode_av(data: bytes, container: str, limits: AudioLimits, item: ItemRef) -> tuple[np.ndarray, int, int, str]:
    label = {"isobmff": "M4A/MP4", "ebml": "WebM/Matroska", "aac": "AAC"}[container]
    try:
        box = av.open(io.BytesIO(data), format=_AV_FORMAT[container])
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise CorruptMediaError(f"the {label} audio is truncated or corrupt.", item=item) from exc
    with box:
        if not box.streams.audio:
            raise UnsupportedFormatError(f"the {label} file has no audio stream.", item=item, code="no_stream")
        stream = box.streams.audio[0]
        codec = _stream_codec(stream)
        if codec not in AV_CODECS:
            raise UnsupportedFormatError(
                f"the audio codec {codec!r} is not supported (supported: {', '.join(sorted(AV_CODECS))}).",
                item=item,
                code="unsupported_codec",
            )
        rate, channels = int(stream.codec_context.sample_rate or 0), int(stream.codec_context.channels or 0)
        _check_stream(rate, channels, limits, item)
        claimed = _claimed_seconds(box, stream)
        if claimed is not None and claimed > limits.max_seconds:
            raise _too_long(claimed, limits, item, claimed=True)
        try:
            mono = _decode_av_samples(box, stream, rate, limits, item)
        except MediaError:
            raise
        except (av.error.FFmpegError, ValueError) as exc:
            raise CorruptMediaError(f"the {label} audio is truncated or corrupt.", item=item) from exc
    return mono, rate, channels, codec


def _stream_codec(stream: av.stream.Stream) -> str:
    ctx = stream.codec_context
    return ctx.codec.canonical_name if ctx is not None and ctx.codec is not None else "unknown"


def _claimed_seconds(box: av.container.InputContainer, stream: av.stream.Stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if box.duration is not None:
        return box.duration / av.time_base
    return None


def _decode_av_samples(
    box: av.container.InputContainer, stream: av.stream.Stream, rate: int, limits: AudioLimits, item: ItemRef
) -> np.ndarray:
    budget = int(limits.max_seconds * rate)
    converter = None  # planar float at the stream's rate and the first frame's layout, absorbing later changes
    blocks: list[np.ndarray] = []
    total = [0]  # samples taken so far

    def take(frames: list[av.AudioFrame]) -> None:
        for out in frames:
            blocks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))  # [channels, n] -> [n]
            total[0] += len(blocks[-1])
        if total[0] > budget:
            raise _too_long(None, limits, item, claimed=False)

    for frame in box.decode(stream):
        if converter is None:
            converter = av.AudioResampler(format="fltp", layout=frame.layout.name, rate=rate)
        take(converter.resample(frame))
    if converter is not None:
        take(converter.resample(None))
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
