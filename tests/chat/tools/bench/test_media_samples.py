"""chat/tools/bench/media_samples.py: the benchmarks' media, made in memory: each in its format, of the size asked,
the same bytes for the same seed (a repeat hashes the same) and other bytes for another."""

import io

import numpy as np
import pytest
import soundfile
from PIL import Image

from chat.tools.bench.media_samples import moving_box_mp4, photo, picture, tone_wav


@pytest.mark.parametrize(("make", "times"), [(picture, 2), (tone_wav, 2), (moving_box_mp4, 20), (photo, 2)])
def test_the_same_seed_makes_the_same_bytes_and_another_seed_others(make, times):
    """The video 20 times (3 ms each): an encoder that varies from run to run gave 5-7 distinct files in 30 here."""
    assert len({make(1) for _ in range(times)}) == 1 and make(1) != make(2)


def test_pictures_and_photos_are_png_and_jpeg_of_the_size_asked():
    with Image.open(io.BytesIO(picture(0, width=64, height=48))) as image:
        assert (image.format, image.size) == ("PNG", (64, 48))
    data = photo(0, width=320, height=240)
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.size) == ("JPEG", (320, 240))
    assert len(data) > 20_000  # camera-like noise: not a flat gradient's few kilobytes


def test_a_tone_is_a_wav_of_the_length_and_rate_asked():
    wave, rate = soundfile.read(io.BytesIO(tone_wav(0, seconds=0.5, rate=8_000)))
    assert rate == 8_000 and wave.shape == (4_000,) and 0.1 < np.abs(wave).max() <= 0.6


def test_a_video_is_an_h264_mp4_with_the_frames_asked():
    import av

    with av.open(io.BytesIO(moving_box_mp4(0, frames=6, fps=3))) as box:
        stream = box.streams.video[0]
        assert stream.codec_context.name == "h264" and (stream.width, stream.height) == (96, 64)
        frames = [frame.to_ndarray(format="rgb24") for frame in box.decode(stream)]
    assert len(frames) == 6 and not np.array_equal(frames[0], frames[-1])  # the box moved
