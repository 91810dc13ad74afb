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

from chat.engine.constraints import GrammarSpec, canonical_json
from chat.engine.errors import NoChatTemplateError, UnsupportedMediaError
from chat.engine.events import Done, TurnRequest
from chat.engine.runtime import ChatRenderer
from chat.engine.sampling import SamplingParams
from chat.protocol.content import PromptMessage, TextPart
from chat.protocol.sampling import SamplingSettings
from chat.protocol.server_events import Timings, Usage

DECIMALS = 3  # milliseconds and tokens per second on the wire are rounded to this many decimals


OPENAI_DEFAULTS: dict[str, Any] = {  # what a field left out means when the model's generation_config is silent
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}


class SamplingFieldError(ValueError):
    """A sampling field that is in range on the wire but not for this model (``.field`` names it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def chats(runtime) -> bool:
    """Whether ``runtime`` renders chat turns: it has a chat template (a base model has none; a runtime that does not
    say, a test's fake, is taken to)."""
    return bool(getattr(runtime, "chats", True))


def require_chat(runtime) -> None:
    """Raises NoChatTemplateError (400 ``no_chat_template``, naming ``--chat-template``) for a base model: every chat
    route checks this before anything else of the request is looked at."""
    if not chats(runtime):
        raise NoChatTemplateError(getattr(runtime, "name", "?"))


def turn_request(
    messages: Iterable[PromptMessage],
    settings: SamplingSettings,
    *,
    salt: str,
    runtime,
    reply_cap: int | None = None,
) -> TurnRequest:
    """The engine's request for a reply to ``messages``.

    Raises:
        UnsupportedMediaError: a media part of a kind the model does not take (``.item`` names it).
        SamplingFieldError: a logit_bias token id outside the model's vocabulary.
    """
    params = sampling_params(settings, runtime, reply_cap=reply_cap)
    return TurnRequest(engine_messages(messages, runtime), params, salt=salt)


def sampling_params(settings: SamplingSettings, runtime=None, *, reply_cap: int | None = None) -> SamplingParams:
    """The engine's sampling settings: ``settings`` (validated on the wire) with every field left out taken from
    ``runtime.generation_defaults``, else :data:`OPENAI_DEFAULTS`; ``max_tokens`` left out is ``reply_cap`` (None: up
    to the end of the context window).

    Raises:
        SamplingFieldError: a logit_bias token id outside ``runtime``'s vocabulary.
    """
    model_defaults = getattr(runtime, "generation_defaults", None) or {}
    values: dict[str, Any] = {}
    for name, fallback in OPENAI_DEFAULTS.items():
        given = getattr(settings, name)
        values[name] = given if given is not None else model_defaults.get(name, fallback)
    vocab = getattr(runtime, "vocab_size", None)
    bias = tuple(sorted((int(k), float(v)) for k, v in (settings.logit_bias or {}).items()))
    outside = [t for t, _ in bias if vocab is not None and t >= vocab]
    if outside:
        raise SamplingFieldError("logit_bias", f"token id {outside[0]} is outside the vocabulary (0..{vocab - 1})")
    return SamplingParams(
        **values,
        seed=settings.seed,
        max_tokens=settings.max_tokens if settings.max_tokens is not None else reply_cap,
        stop=tuple(settings.stop or ()),
        logit_bias=bias,
        logprobs=bool(settings.logprobs),
        top_logprobs=settings.top_logprobs or 0,
        grammar=grammar_spec(settings),
        priority=settings.priority,
    )


def grammar_spec(settings: SamplingSettings) -> GrammarSpec | None:
    """What ``response_format`` or ``structured_outputs`` asks the reply to match (None: free text)."""
    fmt, so = settings.response_format, settings.structured_outputs
    if fmt is not None and fmt.type == "json_object":
        return GrammarSpec("json_object")
    if fmt is not None and fmt.type == "json_schema":
        assert fmt.json_schema is not None
        schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {}
        return GrammarSpec("json_schema", canonical_json(schema), strict=bool(fmt.json_schema.strict))
    if so is None:
        return None
    if so.json_ is not None:
        return GrammarSpec("json_schema", canonical_json(so.json_), strict=False)
    if so.json_object:
        return GrammarSpec("json_object")
    if so.regex is not None:
        return GrammarSpec("regex", so.regex)
    if so.grammar is not None:
        return GrammarSpec("grammar", so.grammar)
    assert so.choice is not None
    return GrammarSpec("choice", canonical_json(so.choice))


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
    return Usage.of(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.cache_miss_reason, u.cache_miss_at)


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
