"""Media made on the fly for the tests (no binary files are committed), and crafted bad headers."""

from __future__ import annotations

import io
import struct
import zlib
from fractions import Fraction

import av
import numpy as np
import soundfile
from PIL import Image

# ---- images -------------------------------------------------------------------------------------------------------


def picture(width: int = 64, height: int = 48, mode: str = "RGB") -> Image.Image:
    """A picture whose orientation is visible: red top-left quadrant, blue bottom-right, green elsewhere."""
    arr = np.zeros((height, width, 3), np.uint8)
    arr[:, :] = (0, 200, 0)
    arr[: height // 2, : width // 2] = (220, 0, 0)
    arr[height // 2 :, width // 2 :] = (0, 0, 220)
    im = Image.fromarray(arr)
    return im if mode == "RGB" else im.convert(mode)


def encode_image(im: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def rotated_jpeg(orientation: int = 6) -> tuple[bytes, Image.Image]:
    """A JPEG stored sideways with an EXIF Orientation tag; returns it and the upright picture it shows.

    Orientation 6 means "rotate 90 degrees clockwise to display", so the stored pixels are the upright picture
    rotated 90 degrees counter-clockwise.
    """
    upright = picture(64, 48)
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # counter-clockwise
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode_image(stored, "JPEG", quality=95, exif=exif.tobytes()), upright


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_with_size(width: int, height: int) -> bytes:
    """A tiny PNG whose IHDR declares ``width x height`` but whose data is a few bytes (a decompression bomb header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 16)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


# ---- audio --------------------------------------------------------------------------------------------------------


def tone(seconds: float = 0.5, rate: int = 16_000, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    """float32 [n, channels]: a sine at ``freq`` (channel k at amplitude 0.5 / (k + 1))."""
    t = np.arange(int(seconds * rate)) / rate
    wave = np.sin(2 * np.pi * freq * t)
    return np.stack([0.5 / (k + 1) * wave for k in range(channels)], axis=1).astype(np.float32)


def sf_audio(
    fmt: str, subtype: str | None = None, seconds: float = 0.5, rate: int = 16_000, channels: int = 1
) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, tone(seconds, rate, channels=channels), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def wav_bytes(
    pcm: bytes, *, rate: int = 16_000, channels: int = 1, data_size: int | None = None, tag: int = 1
) -> bytes:
    """A 16-bit WAV with ``pcm`` as samples; ``data_size`` overrides the size its ``data`` chunk declares."""
    block = 2 * channels
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, 16)
    size = len(pcm) if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size) + pcm
    return b"RIFF" + struct.pack("<I", min(4 + len(body), 0xFFFFFFFF)) + body


def pcm16(seconds: float = 0.1, rate: int = 16_000) -> bytes:
    return (tone(seconds, rate)[:, 0] * 32767).astype("<i2").tobytes()


def av_audio(fmt: str, codec: str, seconds: float = 0.5, rate: int = 48_000, layout: str = "stereo") -> bytes:
    """Audio encoded with PyAV into container ``fmt`` ("mp4", "ipod", "webm", ...)."""
    channels = 2 if layout == "stereo" else 1
    x = tone(seconds, rate, channels=channels).T  # [channels, n]
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as box:
        stream = box.add_stream(codec, rate=rate, layout=layout)
        ctx = stream.codec_context
        step = ctx.frame_size or 1024
        sample_fmt = ctx.format.name
        for start in range(0, x.shape[1], step):
            chunk = x[:, start : start + step]
            frame = av.AudioFrame.from_ndarray(_as_format(chunk, sample_fmt), format=sample_fmt, layout=layout)
            frame.sample_rate = rate
            frame.pts = start
            frame.time_base = Fraction(1, rate)
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return buf.getvalue()


def _as_format(chunk: np.ndarray, sample_fmt: str) -> np.ndarray:
    planar = sample_fmt.endswith("p")
    base = sample_fmt.rstrip("p")
    if base == "s16":
        chunk = (chunk * 32767).astype(np.int16)
    elif base == "s32":
        chunk = (chunk * 2**31 * 0.99).astype(np.int32)
    else:
        chunk = chunk.astype(np.float32)
    return np.ascontiguousarray(chunk if planar else chunk.T.reshape(1, -1))


# ---- video --------------------------------------------------------------------------------------------------------


def video_frame(i: int, width: int, height: int) -> np.ndarray:
    """Frame ``i``: its index is readable from the mean brightness of the left half (i * 8 % 256)."""
    arr = np.zeros((height, width, 3), np.uint8)
    arr[:, : width // 2] = (i * 8) % 256
    arr[:, width // 2 :] = 128
    return arr


def av_video(
    fmt: str = "mp4",
    codec: str = "libx264",
    frames: int = 12,
    fps: int = 10,
    width: int = 64,
    height: int = 48,
    gop: int | None = None,
    options: dict[str, str] | None = None,
) -> bytes:
    """A video of ``frames`` frames (see :func:`video_frame`) at ``fps``, encoded with PyAV."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as box:
        stream = box.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if gop is not None:
            stream.codec_context.gop_size = gop
        if options:
            stream.options = options
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(video_frame(i, width, height), format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return buf.getvalue()


def frame_index(frame: np.ndarray) -> int:
    """Inverse of :func:`video_frame` for the small indices the tests use (< 32)."""
    return round(float(frame[:, : frame.shape[1] // 2].mean()) / 8)
