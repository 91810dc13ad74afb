"""OpenAI-shaped messages (string content or content parts) -> the messages a runtime renders.

Text parts are joined. Media parts (``image_url``, ``input_audio``, ``video_url``) are refused with a typed error naming
the item when the model has no such modality; otherwise they are decoded with :mod:`modalities` (limits, format checks),
so that a corrupt or oversized item fails its turn before any compute. Handing decoded media to a multimodal model
arrives with such models; until then a model that declares a modality receives only the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chat.engine.errors import InvalidMediaError, UnsupportedMediaError

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
                    check_media(part, f"messages[{i}].content[{j}]")
                    continue
                pieces.append(part.get("text", ""))
            text = "".join(pieces)
        role = "system" if message.get("role") == "developer" else message.get("role")
        out.append({"role": role, "content": text})
    return out


def check_media(part: Mapping[str, Any], item: str) -> None:
    """Decode one media part (and drop the result), or raise InvalidMediaError naming ``item``."""
    from modalities import audio, image, video
    from modalities.errors import MediaError
    from modalities.identity import decode_base64, parse_data_url

    try:
        kind = part["type"]
        if kind == "input_audio":
            body = part["input_audio"]
            audio.decode(decode_base64(body["data"], item=item), declared=body.get("format"), item=item)
        else:
            field = "image_url" if kind == "image_url" else "video_url"
            url = parse_data_url(part[field]["url"], item=item)
            (image if kind == "image_url" else video).decode(url.data, declared=url.mime or None, item=item)
    except MediaError as exc:
        raise InvalidMediaError(item, str(exc)) from exc
    except (KeyError, TypeError) as exc:
        raise InvalidMediaError(item, f"{item}: malformed media part") from exc
