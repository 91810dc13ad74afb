"""OpenAI-shaped messages (string content or content parts) -> the messages a runtime renders.

Text parts are joined. Media parts (``image_url``, ``input_audio``, ``video_url``) are refused with a typed error naming
the item when the model has no such modality (the media path for multimodal models arrives with them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chat.engine.errors import UnsupportedMediaError

MEDIA_KIND = {"image_url": "image", "input_audio": "audio", "video_url": "video"}


def engine_messages(messages: Iterable[Mapping[str, Any]], runtime) -> list[dict[str, str]]:
    """Raises:
    UnsupportedMediaError: a media part the model cannot take.
    """
    accepted = getattr(runtime, "modalities", frozenset())
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if content is None or isinstance(content, str):
            text = content or ""
        else:
            pieces = []
            for j, part in enumerate(content):
                kind = MEDIA_KIND.get(part.get("type"))
                if kind is not None:
                    if kind not in accepted:
                        raise UnsupportedMediaError(f"messages[{i}].content[{j}]", kind, runtime.name)
                    continue
                pieces.append(part.get("text", ""))
            text = "".join(pieces)
        role = "system" if message.get("role") == "developer" else message.get("role")
        out.append({"role": role, "content": text})
    return out
