"""``POST /tokenize`` and ``POST /detokenize``, as vLLM's, for clients that count tokens before they send.

``/tokenize`` takes a ``prompt`` (encoded as ``/v1/completions`` encodes a string: the tokenizer's own BOS, if
any) or chat ``messages`` (rendered through the model's chat template, with the generation prompt unless
``add_generation_prompt`` is false; text only; a base model answers ``no_chat_template``) and answers
``{"count", "max_model_len", "tokens"}``.
``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chat.protocol.client_events import ModelName
from chat.protocol.errors import ErrorCode
from chat.protocol.limits import MAX_MESSAGES, MAX_TEXT_CHARS
from chat.server.errors import RequestError
from chat.server.reply.turns import require_chat
from chat.server.surfaces.completions_api import prompt_ids

MAX_DETOKENIZE = 1_000_000  # token ids in one /detokenize request


class TextMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(pattern="^(system|developer|user|assistant)$")
    content: str = Field(max_length=MAX_TEXT_CHARS)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    prompt: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    messages: list[TextMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE)


def tokenize(req: TokenizeRequest, runtime) -> dict:
    if req.prompt is not None:
        ids = prompt_ids(runtime, req.prompt)
    else:
        require_chat(runtime)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.content} for m in req.messages]
        ids = list(runtime.render(messages, add_generation_prompt=req.add_generation_prompt))
    return {"count": len(ids), "max_model_len": runtime.context_window, "tokens": ids}


def detokenize(req: DetokenizeRequest, runtime) -> dict:
    """Raises RequestError: a token id outside the vocabulary."""
    vocab = runtime.vocab_size
    bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(ErrorCode.INVALID_REQUEST, f"tokens: id {bad} is outside 0..{vocab - 1}", param="tokens")
    return {"prompt": runtime.decode(req.tokens)}
