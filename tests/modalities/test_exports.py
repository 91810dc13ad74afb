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
            "MediaError",
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
