"""OpenAI-shaped messages (string content or content parts) -> the messages a runtime renders.

Text parts are joined. Media parts (``image_url``, ``input_audio``, ``video_url``) are refused with a typed error naming
the item when the model has no such modality; otherwise their data URL / base64 payload is unpacked into a
:class:`modalities.parts.MediaPart` (kind, bytes, declared format, item name) and the message keeps its parts in
order. Decoding happens in the runtime (``render_prompt``), once per distinct item: a corrupt or oversized item fails
its turn there, before any compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chat.engine.errors import InvalidMediaError, UnsupportedMediaError
from chat.engine.runtime import ModelRuntime
from modalities.parts import MediaPart

MEDIA_KIND = {"image_url": "image", "input_audio": "audio", "video_url": "video"}


def engine_messages(messages: Iterable[Mapping[str, Any]], runtime: ModelRuntime) -> list[dict[str, Any]]:
    """Messages whose content is a string, or (when media are present) a list of text dicts and MediaParts.

    Raises:
        UnsupportedMediaError: a media part the model cannot take.
        InvalidMediaError: a media part that is not a readable data URL / base64 payload.
    """
    accepted = runtime.modalities
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        role = "system" if message.get("role") == "developer" else message.get("role")
        if content is None or isinstance(content, str):
            out.append({"role": role, "content": content or ""})
            continue
        parts: list[Any] = []
        for j, part in enumerate(content):
            kind = MEDIA_KIND.get(part.get("type"))
            item = f"messages[{i}].content[{j}]"
            if kind is None:
                text = part.get("text", "")
                if parts and isinstance(parts[-1], dict):
                    parts[-1] = {"type": "text", "text": parts[-1]["text"] + text}
                else:
                    parts.append({"type": "text", "text": text})
                continue
            if kind not in accepted:
                raise UnsupportedMediaError(item, kind, runtime.name)
            parts.append(media_part(part, kind, item))
        if all(isinstance(p, dict) for p in parts):
            out.append({"role": role, "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": role, "content": parts})
    return out


def media_part(part: Mapping[str, Any], kind: str, item: str) -> MediaPart:
    """Unpack one media part's payload (no decoding), or raise InvalidMediaError naming ``item``."""
    from modalities.errors import MediaError
    from modalities.identity import decode_base64, parse_data_url

    try:
        if kind == "audio":
            body = part["input_audio"]
            return MediaPart(kind, decode_base64(body["data"], item=item), body.get("format"), item)
        url = parse_data_url(part["image_url" if kind == "image" else "video_url"]["url"], item=item)
        return MediaPart(kind, url.data, url.mime or None, item)
    except MediaError as exc:
        raise InvalidMediaError(item, str(exc)) from exc
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidMediaError(item, f"{item}: malformed media part") from exc
