"""A model's chat template without its weights: what a cluster's ingress needs to make routing keys and check media.

Build one with :func:`chat.models.load_renderer` (the same specs as ``load_model``): it reads the tokenizer, the chat
template and the config (and, for multimodal models, the processor settings that say which media kinds it takes),
never the weights. It is a ``chat.engine.runtime.ChatRenderer``; a ``ModelAdapter`` of the same spec is one too, and
renders text messages to the same token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chat.models.chat_template import render_text, template_of
from chat.models.errors import InvalidSettingError


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    encode: Callable[[str], list[int]] | None = None,
    *,
    model: str = "this model",
) -> list[int]:
    """Token ids of ``messages`` (``{"role", "content"}`` with string content; an assistant message may carry
    ``tool_calls`` and a ``tool`` message ``tool_call_id``) through ``tokenizer``'s chat template, given ``tools``
    (OpenAI's function definitions) when the template takes them. ``encode``: the rendered text's ids (default
    ``tokenizer.encode`` without special tokens added; a :class:`~chat.models.prompt_tokens.PromptEncoder` gives the
    same ids, reusing earlier renders'). ``model``: the name errors give.

    Raises:
        InvalidSettingError: a message is not a role/content pair of strings (``field`` names which).
        NoChatTemplateError: the tokenizer has no chat template (a base model).
        ChatTemplateError: the template raised while rendering (:mod:`chat.models.chat_template`).
    """
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidSettingError(f"messages[{i}].role", "each message needs a string role")
        if not isinstance(m.get("content"), str):
            raise InvalidSettingError(f"messages[{i}].content", "content must be a string for this model")
        clean.append({k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in m})
    extra = {**(template_kwargs or {}), **({"tools": list(tools)} if tools else {})}  # template variables
    text = render_text(tokenizer, clean, model=model, add_generation_prompt=add_generation_prompt, **extra)
    return encode(text) if encode is not None else list(tokenizer.encode(text, add_special_tokens=False))


class TemplateRenderer:
    """A model's name, media kinds and chat template (no weights)."""

    def __init__(self, tokenizer: Any, *, name: str, modalities: frozenset[str] = frozenset()) -> None:
        self._tokenizer = tokenizer  # the model's tokenizer, with its chat template (None: a base model)
        self.name = name  # what /v1/models lists (the name load_model gives the adapter)
        self.modalities = modalities  # media kinds the model takes; empty for text models
        self.chats = template_of(tokenizer) is not None  # it has a chat template: chat turns can be rendered
        self._vocabulary: Any = None  # token bytes, built at the first log-probability

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of text-only ``messages``, as ``ModelAdapter.render`` of the same model gives them.

        Raises:
            InvalidSettingError: a message is not a role/content pair of strings.
            NoChatTemplateError, ChatTemplateError: no template, or it raised.
        """
        return render_chat(self._tokenizer, messages, add_generation_prompt, model=self.name)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens), as ``ModelAdapter.encode`` gives them."""
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """A completions prompt's ids, as ``ModelAdapter.encode_prompt`` gives them (the tokenizer's own BOS)."""
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes (for log-probabilities a replica reports)."""
        from chat.models.vocabulary import Vocabulary

        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self._tokenizer, logits_width=len(self._tokenizer), eos_token_ids=())
        return self._vocabulary.token_bytes(token_id)

    def __repr__(self) -> str:
        return f"TemplateRenderer({self.name!r}, modalities={sorted(self.modalities)})"
