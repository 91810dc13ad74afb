"""turncache's media layer: decode, validate and identify images, audio and video. Pure functions, typed errors,
no model.

- :mod:`modalities.image`, :mod:`modalities.audio`, :mod:`modalities.video`: ``decode(data, limits, options, *,
  declared, item)`` and ``fingerprint(processor, options, processor_settings)`` each;
- :mod:`modalities.identity`: :func:`content_hash` (computed from the bytes' digest, before decoding) and ``data:``
  URL parsing;
- :mod:`modalities.parts`: :class:`MediaInput`, one item of a request (kind, encoded bytes and their digest);
- :mod:`modalities.formats`: the one magic-byte sniffer (also used by ``chat.tools.client``);
- :mod:`modalities.store`: :class:`MediaStore`, an LRU of decoded / encoded media keyed by content hash;
- :mod:`modalities.limits`, :mod:`modalities.errors`: named limits and the one error hierarchy.

Importing the package is cheap: the decoders (and numpy, Pillow, PyAV, soundfile behind them) load on first use of
a name that needs them, so torch-free, numpy-free callers (the Python chat client) can use :mod:`modalities.formats`
and :mod:`modalities.identity`.

Typical use for one content part::

    url = parse_data_url(part_url, max_bytes=limits.image.max_bytes, item=i)
    fp = image.fingerprint("Qwen2VLImageProcessorPil", ImageOptions(), {"max_pixels": 1_003_520})
    key = content_hash(media_digest(url.data), fp)
    decoded = store.get_or_decode(key, lambda: image.decode(url.data, limits.image, declared=url.mime, item=i))
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "audio": "modalities.audio",
    "image": "modalities.image",
    "video": "modalities.video",
    "AudioOptions": "modalities.audio",
    "DecodedAudio": "modalities.audio",
    "CorruptMediaError": "modalities.errors",
    "MediaError": "modalities.errors",
    "MediaTooLargeError": "modalities.errors",
    "MediaURLError": "modalities.errors",
    "UnsupportedFormatError": "modalities.errors",
    "ContentHash": "modalities.identity",
    "DataURL": "modalities.identity",
    "Fingerprint": "modalities.identity",
    "MediaDigest": "modalities.identity",
    "content_hash": "modalities.identity",
    "decode_base64": "modalities.identity",
    "media_digest": "modalities.identity",
    "parse_data_url": "modalities.identity",
    "DecodedImage": "modalities.image",
    "ImageOptions": "modalities.image",
    "AudioLimits": "modalities.limits",
    "ImageLimits": "modalities.limits",
    "MediaLimits": "modalities.limits",
    "VideoLimits": "modalities.limits",
    "MediaInput": "modalities.parts",
    "MediaStore": "modalities.store",
    "StoreStats": "modalities.store",
    "DecodedVideo": "modalities.video",
    "VideoOptions": "modalities.video",
}  # public name -> the module that defines it (a module name maps to itself)

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'modalities' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if module == f"modalities.{name}" else getattr(loaded, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
