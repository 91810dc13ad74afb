"""turncache's media layer: decode, validate and identify images, audio and video. Pure functions, typed errors,
no model.

- :mod:`modalities.image`, :mod:`modalities.audio`, :mod:`modalities.video`: ``decode(data, limits, options, *,
  declared, item)`` and ``fingerprint(processor, options, processor_settings)`` each;
- :mod:`modalities.identity`: :func:`content_hash` (computed before decoding) and ``data:`` URL parsing;
- :mod:`modalities.store`: :class:`MediaStore`, an LRU of decoded / encoded media keyed by content hash;
- :mod:`modalities.limits`, :mod:`modalities.errors`: named limits and the one error hierarchy.

Typical use for one content part::

    url = parse_data_url(part_url, max_bytes=limits.image.max_bytes, item=i)
    fp = image.fingerprint("Qwen2VLImageProcessorPil", ImageOptions(), {"max_pixels": 1_003_520})
    key = content_hash(url.data, fp)
    decoded = store.get_or_decode(key, lambda: image.decode(url.data, limits.image, declared=url.mime, item=i))
"""

from modalities import audio, image, video
from modalities.audio import AudioOptions, DecodedAudio
from modalities.errors import (
    CorruptMediaError,
    MediaError,
    MediaTooLargeError,
    MediaURLError,
    UnsupportedFormatError,
)
from modalities.identity import ContentHash, DataURL, Fingerprint, content_hash, decode_base64, parse_data_url
from modalities.image import DecodedImage, ImageOptions
from modalities.limits import AudioLimits, ImageLimits, MediaLimits, VideoLimits
from modalities.store import MediaStore, StoreStats
from modalities.video import DecodedVideo, VideoOptions

__all__ = [
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
