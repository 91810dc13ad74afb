"""Generate the media of the example eval dataset (examples/eval/dataset.jsonl) into examples/eval/media/.

Nothing binary is committed: images are drawn with Pillow, audio is synthesized with numpy and written with
soundfile, the video is encoded with PyAV. Run it once before `turncache eval examples/eval/dataset.jsonl`:

    .venv/bin/python examples/eval/make_media.py            # writes examples/eval/media/*
    .venv/bin/python examples/eval/make_media.py --out DIR  # elsewhere (the dataset expects media/ next to it)
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soundfile
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
SAMPLE_RATE = 16_000  # Hz, what speech and audio encoders usually take


def red_square(path: Path) -> None:
    """A red square in the middle of a white 96x96 image."""
    image = Image.new("RGB", (96, 96), "white")
    ImageDraw.Draw(image).rectangle((24, 24, 71, 71), fill=(220, 20, 30))
    image.save(path)


def shapes(path: Path) -> None:
    """A blue circle and a green triangle on a light grey 160x96 image."""
    image = Image.new("RGB", (160, 96), (235, 235, 235))
    draw = ImageDraw.Draw(image)
    draw.ellipse((12, 18, 72, 78), fill=(30, 60, 200))
    draw.polygon([(96, 78), (148, 78), (122, 18)], fill=(30, 160, 60))
    image.save(path)


def tone(path: Path, hz: float = 440.0, seconds: float = 1.0) -> None:
    """A pure sine tone (A4 by default) with 20 ms fades, 16-bit mono WAV."""
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    samples = 0.4 * np.sin(2 * np.pi * hz * t)
    fade = int(0.02 * SAMPLE_RATE)
    ramp = np.linspace(0.0, 1.0, fade)
    samples[:fade] *= ramp
    samples[-fade:] *= ramp[::-1]
    soundfile.write(path, samples, SAMPLE_RATE, subtype="PCM_16")


def chirp(path: Path, start_hz: float = 200.0, end_hz: float = 2000.0, seconds: float = 1.5) -> None:
    """A rising sweep from ``start_hz`` to ``end_hz``, FLAC."""
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    phase = 2 * np.pi * (start_hz * t + (end_hz - start_hz) * t**2 / (2 * seconds))
    soundfile.write(path, 0.4 * np.sin(phase), SAMPLE_RATE, format="FLAC", subtype="PCM_16")


def moving_dot(path: Path, frames: int = 16, fps: int = 8, size: int = 64) -> None:
    """A white dot moving from left to right on black: ``frames`` frames at ``fps``, H.264 in MP4."""
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.options = {"preset": "ultrafast", "crf": "28"}
        for i in range(frames):
            x = 8 + (size - 16) * i // (frames - 1)
            image = Image.new("RGB", (size, size), "black")
            ImageDraw.Draw(image).ellipse((x - 6, size // 2 - 6, x + 6, size // 2 + 6), fill="white")
            frame = av.VideoFrame.from_image(image)
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


MEDIA = {
    "red_square.png": red_square,
    "shapes.png": shapes,
    "tone_440hz.wav": tone,
    "chirp.flac": chirp,
    "moving_dot.mp4": moving_dot,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "media", help="directory to write (%(default)s)")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for name, make in MEDIA.items():
        make(out / name)
        print(f"{out / name}  {(out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
