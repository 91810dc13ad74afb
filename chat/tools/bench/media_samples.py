"""Media made in memory for the multimodal benchmarks: drawn images, synthesized audio, short encoded videos.
Deterministic for a given seed, so a repeated item has the same bytes (and the same content hash)."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np


def picture(seed: int, width: int = 320, height: int = 240) -> bytes:
    """A PNG of random coloured boxes on a gradient."""
    from PIL import Image, ImageDraw

    rng = np.random.RandomState(seed)
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    base = (x * rng.rand(3) + y * rng.rand(3)) / 2
    im = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(6):
        x0, y0 = int(rng.randint(0, width - 20)), int(rng.randint(0, height - 20))
        colour = tuple(int(c) for c in rng.randint(0, 256, 3))
        draw.rectangle((x0, y0, x0 + int(rng.randint(10, 80)), y0 + int(rng.randint(10, 60))), fill=colour)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def tone_wav(seed: int, seconds: float = 2.0, rate: int = 16_000) -> bytes:
    """A WAV of two sines whose pitches depend on the seed."""
    import soundfile

    rng = np.random.RandomState(seed)
    t = np.arange(int(seconds * rate)) / rate
    f1, f2 = 200 + 600 * rng.rand(), 800 + 1200 * rng.rand()
    wave = 0.4 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * f2 * t)
    buf = io.BytesIO()
    soundfile.write(buf, wave.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def moving_box_mp4(seed: int, frames: int = 16, fps: int = 8, width: int = 96, height: int = 64) -> bytes:
    """An H.264 MP4 of a box moving across a coloured background: the same bytes for the same arguments."""
    import av

    rng = np.random.RandomState(seed)
    background = rng.randint(0, 256, 3).astype(np.uint8)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as box:
        # no macroblock tree: with it this x264 gave other bytes for the same frames from run to run (5-7 distinct
        # files in 30 encodes here, one thread or not); without it, one in 90
        stream = box.add_stream("libx264", rate=fps, options={"x264-params": "mbtree=0"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            arr = np.empty((height, width, 3), np.uint8)
            arr[:] = background
            x = (i * (width - 16)) // max(1, frames - 1)
            arr[height // 3 : height // 3 + 16, x : x + 16] = 255 - background
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return buf.getvalue()


def photo(seed: int, width: int = 1024, height: int = 768, quality: int = 90) -> bytes:
    """A JPEG with the noise of a camera picture over a gradient (about as many bytes as a phone photo of that size)."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    base = (x * rng.rand(3) + y * rng.rand(3)) / 2 + rng.normal(0, 24, (height, width, 3))
    buf = io.BytesIO()
    Image.fromarray(base.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
