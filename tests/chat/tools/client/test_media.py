"""Media inputs -> content parts: the parts are valid wire content and their bytes decode as the right media."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import soundfile
from PIL import Image as PILImage

from chat.protocol import TurnCreate
from chat.tools.client import Audio, Image, MediaEncodingError, Video, audio_part, image_part, to_content, video_part
from modalities import audio, image


def png_bytes(color: str = "red", size: tuple[int, int] = (8, 6)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def data_of(url: str) -> tuple[str, bytes]:
    head, data = url.split(",", 1)
    return head, base64.b64decode(data)


def wav_bytes(seconds: float = 0.1, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, np.zeros(int(rate * seconds)), rate, format="WAV")
    return out.getvalue()


def mp4_bytes() -> bytes:
    return b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + b"\x00" * 32


def test_a_string_stays_a_string_and_a_list_becomes_parts():
    assert to_content("hello") == "hello"
    assert to_content(["a", {"type": "text", "text": "b"}]) == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]


def test_pil_image_becomes_a_png_data_url_that_decodes():
    part = image_part(PILImage.new("RGB", (8, 6), "blue"))
    head, data = data_of(part["image_url"]["url"])
    assert part["type"] == "image_url" and head == "data:image/png;base64"
    decoded = image.decode(data, declared="image/png")
    assert (decoded.width, decoded.height) == (8, 6)


def test_pil_modes_png_cannot_hold_are_converted():
    part = image_part(PILImage.new("CMYK", (4, 4)))
    assert data_of(part["image_url"]["url"])[0] == "data:image/png;base64"


def test_image_from_path_and_bytes_take_the_format_from_the_bytes(tmp_path: Path):
    jpeg = io.BytesIO()
    PILImage.new("RGB", (4, 4)).save(jpeg, format="JPEG")
    (tmp_path / "photo.png").write_bytes(jpeg.getvalue())  # a misleading suffix
    assert image_part(tmp_path / "photo.png")["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert image_part(png_bytes())["image_url"]["url"].startswith("data:image/png;base64,")


def test_numpy_audio_becomes_16_bit_wav_with_its_rate_and_length():
    samples = np.sin(np.linspace(0, 100, 1600)).astype(np.float32)
    part = audio_part(samples, sample_rate=16000)
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    data = base64.b64decode(part["input_audio"]["data"])
    info = soundfile.info(io.BytesIO(data))
    assert (info.samplerate, info.frames, info.channels, info.subtype) == (16000, 1600, 1, "PCM_16")
    assert audio.decode(data, declared="wav").samples.shape[-1] == 1600


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.uint8, np.int8, np.float64])
def test_numpy_audio_of_any_numeric_dtype_and_stereo(dtype):
    samples = np.zeros((800, 2), dtype=dtype)
    data = base64.b64decode(audio_part(samples, sample_rate=8000)["input_audio"]["data"])
    assert soundfile.info(io.BytesIO(data)).channels == 2


@pytest.mark.parametrize(
    ("samples", "rate"),
    [
        (np.zeros(10), None),
        (np.zeros(10), 0),
        (np.zeros(0), 8000),
        (np.zeros((2, 2, 2)), 8000),
        (np.array([np.nan]), 8000),
        (np.array(["a"]), 8000),
    ],
)
def test_bad_audio_arrays_are_refused_before_sending(samples, rate):
    with pytest.raises(MediaEncodingError):
        audio_part(samples, sample_rate=rate)


def test_audio_files_keep_their_format(tmp_path: Path):
    soundfile.write(tmp_path / "a.flac", np.zeros(800), 8000, format="FLAC")
    assert audio_part(tmp_path / "a.flac")["input_audio"]["format"] == "flac"
    assert audio_part(wav_bytes())["input_audio"]["format"] == "wav"
    assert audio_part(b"\x00\x01", format="mp3")["input_audio"]["format"] == "mp3"


def test_video_from_bytes_and_paths(tmp_path: Path):
    assert video_part(mp4_bytes())["video_url"]["url"].startswith("data:video/mp4;base64,")
    (tmp_path / "clip.webm").write_bytes(b"\x1a\x45\xdf\xa3" + b"\x00" * 16)
    assert video_part(tmp_path / "clip.webm")["video_url"]["url"].startswith("data:video/webm;base64,")


def test_items_are_recognized_by_type(tmp_path: Path):
    (tmp_path / "x.wav").write_bytes(wav_bytes())
    parts = to_content(
        [
            "look",
            PILImage.new("L", (2, 2)),
            tmp_path / "x.wav",
            png_bytes(),
            mp4_bytes(),
            Audio(np.zeros(80), sample_rate=8000),
            Image(png_bytes()),
            Video(mp4_bytes(), mime="video/quicktime"),
        ]
    )
    kinds = " ".join(p["type"] for p in parts)
    assert kinds == "text image_url input_audio image_url video_url input_audio image_url video_url"
    assert parts[-1]["video_url"]["url"].startswith("data:video/quicktime;base64,")
    TurnCreate.model_validate({"type": "turn.create", "content": parts})  # valid wire content


@pytest.mark.parametrize(
    "item",
    [np.zeros(10), b"not media", object(), []],
    ids=["bare-array", "unknown-bytes", "object", "empty-list"],
)
def test_what_cannot_be_encoded_raises_media_encoding_error(item):
    with pytest.raises(MediaEncodingError):
        to_content(item if isinstance(item, list) else [item])


def test_a_missing_or_empty_file_is_a_media_encoding_error(tmp_path: Path):
    with pytest.raises(MediaEncodingError, match="cannot read"):
        image_part(tmp_path / "missing.png")
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(MediaEncodingError, match="empty"):
        image_part(tmp_path / "empty.png")
    assert issubclass(MediaEncodingError, ValueError)


def test_bytes_are_sniffed_by_the_servers_own_sniffer():
    """One sniffer (modalities.formats.sniff) serves the client and the decoders: an AVIF, which shares MP4's box
    structure, goes as an image."""
    import chat.tools.client.media as client_media
    from modalities import formats

    assert client_media.sniff is formats.sniff
    avif = b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf" + b"\x00" * 16
    assert to_content([avif])[0]["image_url"]["url"].startswith("data:image/avif;base64,")
