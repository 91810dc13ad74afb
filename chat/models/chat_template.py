"""A model's chat template: where it comes from (the model's files, or ``--chat-template FILE_OR_TEXT``), whether it
compiles, its digest, and rendering messages through it with typed errors.

Rendering is transformers' (``tokenizer.apply_chat_template``): the template is compiled in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute of Python's internals, no mutation of what it is given, no loader:
no file is read, nothing is fetched) with its few helpers (``raise_exception``, ``strftime_now``, ``tojson``).
``--chat-template`` replaces the file's own template, for any model; it is compiled once at start by the same
compiler, so a template with a syntax error is refused before the server starts, naming its line. What a template
raises while rendering one request (its own ``raise_exception``, an undefined value it calls, an attribute the
sandbox refuses) is that request's :class:`~chat.engine.errors.ChatTemplateError` (400 ``template_error``); a model
without any template answers :class:`~chat.engine.errors.NoChatTemplateError` (400 ``no_chat_template``) to chat
turns and is served for completions.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chat.engine.errors import ChatTemplateError, NoChatTemplateError
from chat.models.errors import InvalidSettingError

FIELD = "chat_template"  # the setting's name in errors (--chat-template, TURNCACHE_CHAT_TEMPLATE)
MAX_TEMPLATE_BYTES = 1 << 20  # a template file larger than this is refused (real templates are a few KiB)
TEMPLATE_MARKERS = ("{{", "{%", "{#")  # a value holding one of these is template text; otherwise a file's path
_TEMPLATE_FILE = "<template>"  # the file name jinja2 gives a template compiled from a string, in tracebacks


def template_of(tokenizer: Any) -> str | None:
    """The tokenizer's chat template, or None (a base model). A template given per name (a dict of named templates,
    as some tokenizers carry) counts as one when it has a ``default``."""
    value = getattr(tokenizer, "chat_template", None)
    if isinstance(value, Mapping):
        value = value.get("default")
    return value if isinstance(value, str) and value.strip() else None


def digest(template: str | None) -> str:
    """``sha256:<hex>`` of the template text, ``none`` without one: the fingerprint's part for the template."""
    return "none" if template is None else "sha256:" + hashlib.sha256(template.encode()).hexdigest()


def read_template(value: str) -> str:
    """The template that ``--chat-template VALUE`` names: ``VALUE`` itself when it holds Jinja markup
    (``{{``, ``{%`` or ``{#``), else the text of the file at that path. Compiled before it is returned.

    Raises:
        InvalidSettingError: ``field == "chat_template"``: an empty value, a file that cannot be read (or is not
            UTF-8, or is over 1 MiB), or a template that does not compile (the message names its line).
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidSettingError(FIELD, "give a template file or the template text")
    if any(marker in value for marker in TEMPLATE_MARKERS):
        text, source = value, "the template text"
    else:
        path = Path(value).expanduser()
        try:
            if path.stat().st_size > MAX_TEMPLATE_BYTES:
                raise InvalidSettingError(FIELD, f"{value}: over {MAX_TEMPLATE_BYTES} bytes; is it a template?")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidSettingError(
                FIELD, f"{value}: no such file (the value is a template file, or template text with {{{{ or {{%)"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidSettingError(FIELD, f"{value}: cannot be read ({exc})") from exc
        if not text.strip():
            raise InvalidSettingError(FIELD, f"{value}: the file is empty")
        source = value
    check_compiles(text, source)
    return text


def check_compiles(template: str, source: str = "the chat template") -> None:
    """Compile ``template`` as rendering will (transformers' sandboxed environment).

    Raises:
        InvalidSettingError: ``field == "chat_template"``, naming ``source``, the line and jinja2's message.
    """
    import jinja2

    try:
        _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidSettingError(FIELD, f"{source}: line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise InvalidSettingError(FIELD, f"{source}: does not compile: {exc}") from None


def render_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """The text of ``messages`` through the tokenizer's chat template (``variables``: ``tools`` and the request's
    template variables).

    Raises:
        NoChatTemplateError: the model has no chat template.
        ChatTemplateError: the template raised while rendering (its message and line).
    """
    if template_of(tokenizer) is None:
        raise NoChatTemplateError(model)
    import jinja2

    try:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **variables
        )
    except jinja2.TemplateError as exc:  # raise_exception, undefined values, SecurityError, a missing include
        raise ChatTemplateError(f"{type(exc).__name__}: {exc}", _template_line(exc)) from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as exc:
        line = _template_line(exc)
        if line is None:  # raised by transformers around the template, not by it: not the request's fault
            raise
        raise ChatTemplateError(f"{type(exc).__name__}: {exc}", line) from exc


def _compile(template: str) -> Any:
    """The template compiled by transformers' own compiler (its sandboxed environment, cached per text)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template)


def _template_line(exc: BaseException) -> int | None:
    """The template line where ``exc`` was raised (jinja2 maps compiled frames back to template lines in the
    traceback), or None when it was not raised inside a template."""
    line = None
    tb = exc.__traceback__ if exc.__traceback__ is not None else sys.exc_info()[2]
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
