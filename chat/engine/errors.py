"""Errors of the turn engine::

EngineError
├── InvalidBatchSettingError  a scheduler setting out of range (``.field`` names it; refused at start)
├── ContextOverflowError   the prompt does not fit the model's context window (raised before any compute)
├── UnsupportedMediaError  a media part for a model without that modality (``.item`` names it)
├── InvalidMediaError      a media part that is corrupt, mislabeled, unsupported or too large (``.item``)
├── GrammarError           a response_format / structured_outputs that does not compile (chat.engine.constraints)
├── NoChatTemplateError    a chat turn for a model without a chat template (a base model; raised before any compute)
├── ChatTemplateError      the chat template raised while rendering a request's messages (``.line``: where)
└── EngineClosedError      the engine was shut down

Sampling settings are validated on the wire (``chat.protocol.sampling``), once, not here. How each error is reported
to a client (wire code, HTTP status, WebSocket close code) is in ``chat/server/errors.py``.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of the engine's errors."""


class InvalidBatchSettingError(EngineError, ValueError):
    """A scheduler setting out of range, refused when the engine starts."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field  # name of the offending setting


class ContextOverflowError(EngineError, ValueError):
    """The prompt leaves no room for a reply in the model's context window."""

    def __init__(self, prompt_tokens: int, context_window: int) -> None:
        super().__init__(
            f"the prompt has {prompt_tokens} tokens; the model's context window is {context_window} "
            "(at least one token must remain for the reply)"
        )
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window


class EngineClosedError(EngineError):
    """The engine was shut down and takes no more turns."""


class UnsupportedMediaError(EngineError, ValueError):
    """A media part was sent to a model without that modality (``.item`` names it, e.g. "messages[1].content[0]")."""

    def __init__(self, item: str, kind: str, model: str) -> None:
        super().__init__(f"{item}: the model {model!r} does not accept {kind} input")
        self.item = item
        self.kind = kind


class InvalidMediaError(EngineError, ValueError):
    """A media part that cannot be used: not a data URL, bad base64, corrupt, unsupported or over a limit.

    ``.item`` names it (e.g. "messages[1].content[0]"); the message says what is wrong in words a user can act on.
    """

    def __init__(self, item: str, message: str) -> None:
        super().__init__(message)
        self.item = item


class NoChatTemplateError(EngineError, ValueError):
    """A chat turn (messages to render) for a model without a chat template: a base model, served for completions
    (``/v1/completions``, ``/tokenize``). Nothing is guessed in its place; ``--chat-template`` gives it one."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"the model {model!r} has no chat template (a base model): use /v1/completions with a prompt, or start "
            "the server with --chat-template FILE (or TURNCACHE_CHAT_TEMPLATE) to chat with it"
        )
        self.model = model


class ChatTemplateError(EngineError, ValueError):
    """The chat template raised while rendering a request's messages (its own ``raise_exception``, an undefined
    value, an operation the sandbox refuses). ``.line``: the template's line, when known."""

    def __init__(self, problem: str, line: int | None = None) -> None:
        where = f" at line {line}" if line is not None else ""
        super().__init__(f"the chat template failed{where}: {problem}")
        self.problem = problem
        self.line = line
