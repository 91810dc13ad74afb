"""Pin the public names of the package (a removal or rename must be deliberate)."""

from __future__ import annotations

import modalities


def test_public_names() -> None:
    assert sorted(modalities.__all__) == sorted(
        [
            "AudioLimits",
            "AudioOptions",
            "ContentHash",
            "CorruptMediaError",
            "DataURL",
            "DecodedAudio",
            "DecodedImage",
            "DecodedVideo",
            "Fingerprint",
            "ImageLimits",
            "ImageOptions",
            "MediaDigest",
            "MediaError",
            "MediaInput",
            "MediaLimits",
            "MediaStore",
            "MediaTooLargeError",
            "MediaURLError",
            "StoreStats",
            "UnsupportedFormatError",
            "VideoLimits",
            "VideoOptions",
            "audio",
            "content_hash",
            "decode_base64",
            "image",
            "media_digest",
            "parse_data_url",
            "video",
        ]
    )
    for name in modalities.__all__:
        assert getattr(modalities, name) is not None


def test_each_modality_module_has_the_same_shape() -> None:
    for module in (modalities.image, modalities.audio, modalities.video):
        assert callable(module.decode)
        assert callable(module.fingerprint)
        assert isinstance(module.DECODER_VERSION, int)
        assert module.CONTAINERS


def test_importing_the_package_loads_no_decoder() -> None:
    """The Python client sniffs formats and hashes with this package; it must not pull numpy, Pillow or PyAV."""
    import subprocess
    import sys

    code = (
        "import sys; import modalities, modalities.formats, modalities.identity, modalities.parts; "
        "print(*sorted(m for m in ('numpy', 'PIL', 'av', 'soundfile', 'torch') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
