"""Between the wire and the engine, for both transports: validated wire messages and sampling settings -> the
engine's :class:`~chat.engine.events.TurnRequest`; the engine's usage and timings -> their wire shapes.

The WebSocket (``ws.py``) and the OpenAI-compatible HTTP API (``openai_api.py``) both go through here, so a message,
a media item, a sampling setting and a reply's usage mean the same on either::

    request = turn_request(messages, settings, salt=tenant.salt, runtime=engine.runtime)   # may raise, see below
    ... engine.generate(request) ... -> Done
    wire_usage(done), wire_timings(done)   # the `usage` / `timings` objects both transports send

Engine messages are dicts ``{"role", "content"}`` whose content is a string, or a list of ``{"type": "text"}``
dicts and :class:`modalities.parts.MediaInput` s that carry the digest their wire part computed when it was
validated: nothing here decodes or hashes media.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chat.engine.errors import UnsupportedMediaError
from chat.engine.events import Done, TurnRequest
from chat.engine.runtime import ChatRenderer
from chat.engine.sampling import SamplingParams
from chat.protocol.content import PromptMessage, TextPart
from chat.protocol.sampling import SamplingSettings
from chat.protocol.server_events import Timings, Usage

DECIMALS = 3  # milliseconds and tokens per second on the wire are rounded to this many decimals


def turn_request(messages: Iterable[PromptMessage], settings: SamplingSettings, *, salt: str, runtime) -> TurnRequest:
    """The engine's request for a reply to ``messages``.

    Raises:
        UnsupportedMediaError: a media part of a kind the model does not take (``.item`` names it).
    """
    return TurnRequest(engine_messages(messages, runtime), sampling_params(settings), salt=salt)


def sampling_params(settings: SamplingSettings) -> SamplingParams:
    """The engine's sampling settings. ``settings`` was validated on the wire; the engine does not check again."""
    values = settings.model_dump()
    return SamplingParams(**{**values, "stop": tuple(values["stop"])})


def engine_messages(messages: Iterable[PromptMessage], runtime: ChatRenderer) -> list[dict[str, Any]]:
    """Messages whose content is a string, or (when media are present) text dicts and MediaInputs in order; adjacent
    text parts are joined. Media items are named ``messages[i].content[j]`` in errors.

    Raises:
        UnsupportedMediaError: a media part of a kind ``runtime.modalities`` does not list.
    """
    accepted = runtime.modalities
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        parts: list[Any] = []
        for j, part in enumerate(message.content):
            if isinstance(part, TextPart):
                if parts and isinstance(parts[-1], dict):
                    parts[-1] = {"type": "text", "text": parts[-1]["text"] + part.text}
                else:
                    parts.append({"type": "text", "text": part.text})
                continue
            media = part.media(f"messages[{i}].content[{j}]")
            if media.kind not in accepted:
                raise UnsupportedMediaError(media.item, media.kind, runtime.name)
            parts.append(media)
        if all(isinstance(p, dict) for p in parts):
            out.append({"role": message.role, "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": message.role, "content": parts})
    return out


def wire_usage(done: Done) -> Usage:
    """The ``usage`` object of ``reply.done`` and of an HTTP completion (OpenAI's shape, ``cached_tokens`` always)."""
    u = done.usage
    return Usage.of(u.prompt_tokens, u.completion_tokens, u.cached_tokens)


def wire_timings(done: Done) -> Timings:
    """The ``timings`` object of ``reply.done`` and of an HTTP completion; ``ttft_ms`` is left out when no token
    was generated."""
    t = done.timings
    return Timings(
        ttft_ms=round(t.ttft_ms, DECIMALS) if done.usage.completion_tokens else None,
        decode_tokens_per_s=round(t.decode_tokens_per_s, DECIMALS),
        total_ms=round(t.total_ms, DECIMALS),
        prefill_ms=round(t.prefill_ms, DECIMALS),
    )
