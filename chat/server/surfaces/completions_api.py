"""OpenAI's legacy completions: ``POST /v1/completions``, what eval harnesses score with (lm-eval's
``local-completions``).

A prompt is a string (tokenized with the special tokens the model's tokenizer adds to any text, e.g. Gemma's
``<bos>``, and no others; most chat models' tokenizers add none: send token ids for exact control), a list of
token ids, or a list of either (one choice per prompt and ``n``: choice ``i * n + j`` is the ``j``-th reply to
prompt ``i``). ``echo`` puts the prompt before the reply's text; with ``logprobs: N`` the prompt's tokens come
with their log-probabilities too (the first token has none: ``null``), then the reply's, each with its ``N`` most likely
alternatives (and itself) in ``top_logprobs``. ``max_tokens: 0`` computes the prompt only (with ``echo`` and
``logprobs``: its log-likelihood). A request that asks for prompt log-probabilities takes nothing from the prefix
cache (``chat.engine.turn``): every position's logits are computed, and the prompt is stored for later turns.

Sampling fields, refusals and usage are the chat API's (``chat.server.surfaces.openai_api``).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from chat.engine.events import Done, TurnRequest
from chat.protocol.client_events import ModelName
from chat.protocol.errors import ErrorCode
from chat.protocol.limits import MAX_COMPLETION_PROMPTS, MAX_TEXT_CHARS, MAX_TOP_LOGPROBS
from chat.server.errors import RequestError
from chat.server.reply.choices import completion_logprobs, with_seeds
from chat.server.reply.reader import Failed, Finished, Prepared, TextOut, open_replies, whole_replies
from chat.server.reply.turns import sampling_params
from chat.server.surfaces import completions_types as wire
from chat.server.surfaces.openai_api import (
    GENERATION_FAILED,
    StreamOptions,
    grammar_field,
    refuse_unsupported,
    sampling_of,
)
from chat.server.surfaces.openai_types import CompletionUsage, PromptTokensDetails, Timings, encode, usage_of

TokenIds = list[int]
Prompt = str | list[str] | TokenIds | list[TokenIds]


class CompletionRequest(BaseModel):
    """The body of ``POST /v1/completions``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    prompt: Prompt
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension
    min_p: float | None = None  # extension
    repetition_penalty: float | None = None  # extension
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # alternatives per token; 0: the tokens' own only
    echo: bool | None = False
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = 1
    best_of: int | None = None  # honoured only as n (the default): nothing is ranked here
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None  # extension (as vLLM): the completion matches it
    structured_outputs: dict[str, Any] | None = None  # extension
    priority: int | None = None  # extension (vLLM's): lower is served sooner; None: the tenant's default
    suffix: Any = None  # refused unless null: no infilling
    user: Any = None  # refused unless null

    def check(self, max_n: int) -> None:
        """Raises RequestError: a field not honoured, ``n`` or ``best_of`` out of range."""
        refuse_unsupported(self, ("suffix", "user"))
        n = self.n or 1
        if not 1 <= n <= max_n:
            raise RequestError(ErrorCode.INVALID_SAMPLING, f"n: must be in [1, {max_n}]", param="n")
        if self.best_of not in (None, n):
            message = "best_of is supported only equal to n (replies are not ranked here)"
            raise RequestError(ErrorCode.UNSUPPORTED_PARAMETER, message, param="best_of")

    def prompts(self) -> list[str | TokenIds]:
        """The prompts, one per choice group.

        Raises:
            RequestError: ``invalid_request`` for an empty prompt or too many.
        """
        p = self.prompt
        single = isinstance(p, str) or (p and isinstance(p[0], int))
        listed: list[str | TokenIds] = [p] if single else list(p)  # type: ignore[list-item, arg-type]
        if not listed or len(listed) > MAX_COMPLETION_PROMPTS:
            raise RequestError(
                ErrorCode.INVALID_REQUEST, f"prompt: 1 to {MAX_COMPLETION_PROMPTS} prompts per request", param="prompt"
            )
        for item in listed:
            if not item or (isinstance(item, str) and len(item) > MAX_TEXT_CHARS):
                raise RequestError(
                    ErrorCode.INVALID_REQUEST, f"prompt: 1 to {MAX_TEXT_CHARS} characters or tokens", param="prompt"
                )
        return listed


def prompt_ids(runtime, text: str) -> list[int]:
    """A prompt string's ids: with the special tokens the tokenizer adds to any text (Gemma's ``<bos>``), as vLLM
    and llama.cpp tokenize one (a runtime without ``encode_prompt``, a test's fake: its plain ``encode``)."""
    encode = getattr(runtime, "encode_prompt", None) or runtime.encode
    return list(encode(text))


def _tokens(runtime, prompt: str | TokenIds) -> list[int]:
    """Raises RequestError: a token id outside the vocabulary, or a prompt that fills the context window."""
    ids = prompt_ids(runtime, prompt) if isinstance(prompt, str) else list(prompt)
    vocab = getattr(runtime, "vocab_size", None) or 2**31  # a cluster's ingress: its replicas check
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(
            ErrorCode.INVALID_REQUEST, f"prompt: token id {bad} is outside 0..{vocab - 1}", param="prompt"
        )
    if not ids:
        raise RequestError(ErrorCode.INVALID_REQUEST, "prompt: the prompt has no tokens", param="prompt")
    if len(ids) >= getattr(runtime, "context_window", 2**31):
        message = f"prompt: {len(ids)} tokens; the model's context window is {runtime.context_window}"
        raise RequestError(ErrorCode.CONTEXT_OVERFLOW, message, param="prompt")
    return ids


def build_turns(req: CompletionRequest, salt: str, runtime, reply_cap: int | None = None) -> list[TurnRequest]:
    """One TurnRequest per prompt and reply (``len(prompts) * n``), in choice order.

    Raises:
        RequestError, SamplingFieldError: before anything is computed.
    """
    # this API's logprobs is a count of alternatives, not chat's flag: it is read below, not as a sampling field
    settings = sampling_of(req.model_copy(update={"logprobs": None}), req.max_tokens or None)  # 0: this API's alone
    if req.logprobs is not None:
        settings = settings.model_copy(update={"logprobs": True, "top_logprobs": req.logprobs})
    params = sampling_params(settings, runtime, reply_cap=reply_cap)
    params = replace(params, prompt_logprobs=bool(req.echo and req.logprobs is not None))
    if req.max_tokens == 0:
        params = replace(params, max_tokens=0)
    turns: list[TurnRequest] = []
    for prompt in req.prompts():
        ids = _tokens(runtime, prompt)
        turns.extend(with_seeds(TurnRequest((), params, salt=salt, prompt_tokens=ids), req.n or 1))
    return turns


def _prompt_text(runtime, turn: TurnRequest) -> str:
    return runtime.decode(list(turn.prompt_tokens or ()))


def _logprobs(table: dict[str, list] | None) -> wire.CompletionLogprobs | None:
    return wire.CompletionLogprobs(**table) if table is not None else None


def _choice(runtime, req: CompletionRequest, turn: TurnRequest, done: Done, index: int) -> wire.CompletionChoice:
    text, logprobs = done.text, None
    reply_tokens = [lp.token for lp in done.logprobs]
    if req.echo:
        prompt_text = _prompt_text(runtime, turn)
        text = prompt_text + text
    if req.logprobs is not None:
        if req.echo:
            tokens = [*turn.prompt_tokens, *reply_tokens]  # type: ignore[misc]
            logprobs = completion_logprobs(runtime, [*done.prompt_logprobs, *done.logprobs], tokens)
        else:
            logprobs = completion_logprobs(runtime, done.logprobs, reply_tokens)
    finish = "length" if done.finish_reason == "length" else "stop"
    return wire.CompletionChoice(text=text, index=index, logprobs=_logprobs(logprobs), finish_reason=finish)


def _usage(turns: Sequence[TurnRequest], dones: dict[int, Done], n: int) -> tuple[CompletionUsage, Timings]:
    """Each prompt counted once (with the cached tokens of its first reply), every reply's tokens; the first reply's
    timings."""
    groups = [[dones[g * n + j] for j in range(n)] for g in range(len(turns) // n)]
    parts = [usage_of(group) for group in groups]
    usage = CompletionUsage(
        prompt_tokens=sum(u.prompt_tokens for u, _ in parts),
        completion_tokens=sum(u.completion_tokens for u, _ in parts),
        total_tokens=sum(u.total_tokens for u, _ in parts),
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=sum(u.prompt_tokens_details.cached_tokens for u, _ in parts)
        ),
    )
    return usage, parts[0][1]


def prepare(req: CompletionRequest, salt: str, runtime, reply_cap: int | None = None) -> Prepared:
    """The request as the pipeline runs it (see :func:`build_turns`).

    Raises:
        RequestError, SamplingFieldError: before anything is computed.
    """
    return Prepared(build_turns(req, salt, runtime, reply_cap=reply_cap), grammar_field=grammar_field(req))


async def complete(engine, req: CompletionRequest, turns: Sequence[TurnRequest], model: str) -> Response:
    finished = await whole_replies(engine, Prepared(turns))
    dones = {i: reply.done for i, reply in enumerate(finished)}
    runtime = engine.runtime
    usage, timings = _usage(turns, dones, req.n or 1)
    body = wire.Completion(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[_choice(runtime, req, turns[i], dones[i], i) for i in range(len(turns))],
        usage=usage,
        timings=timings,
    )
    return Response(encode(body), media_type="application/json")  # compact, as a JSON response always was


async def stream(
    engine, req: CompletionRequest, turns: Sequence[TurnRequest], model: str, *, max_pending: int | None = None
) -> AsyncIterator[str]:
    """Server-sent events of a streaming completion. With ``echo``, each choice's first chunk is its prompt (and,
    with ``logprobs``, the prompt's log-probabilities, which come once the prompt is computed). The first engine
    batch is awaited before this returns. A client that falls behind reading pauses the turns; ``max_pending``
    events left unread all the same end the stream with a ``slow_client`` error (chat.server.transport.backpressure).

    Raises:
        whatever the turns raise before computing anything.
    """
    replies = await open_replies(engine, Prepared(turns), max_pending=max_pending)
    return _sse(engine.runtime, req, turns, model, replies)


async def _sse(runtime, req, turns, model, replies) -> AsyncIterator[str]:
    """The legacy completions surface's encoder: reply events -> chunks."""
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    offsets = [0] * len(turns)  # characters of each choice's text sent so far (for text_offset)
    echoed = [False] * len(turns)

    envelope = wire.ChunkTemplate(cid, created, model)

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None, usage=None) -> str:
        if finish is None:  # a chunk of text (almost every one): written into the stream's template
            return envelope.text(index, text, _logprobs(logprobs))
        choice = wire.CompletionChoice(text=text, index=index, logprobs=_logprobs(logprobs), finish_reason=finish)
        head = {"id": cid, "created": created, "model": model, "choices": [choice]}
        if usage is None:
            return f"data: {wire.dumps(wire.CompletionChunk(**head))}\n\n"
        return f"data: {wire.dumps(wire.FinalCompletionChunk(**head, usage=usage[0], timings=usage[1]))}\n\n"

    def echo(i: int, done_prompt: Sequence | None) -> str:
        echoed[i] = True
        text = _prompt_text(runtime, turns[i])
        lp = None
        if req.logprobs is not None and done_prompt is not None:
            lp = completion_logprobs(runtime, done_prompt, list(turns[i].prompt_tokens))
        offsets[i] = len(text)
        return chunk(i, text, lp)

    dones: dict[int, Done] = {}
    async with contextlib.aclosing(replies):
        async for batch in replies:
            for i, event in batch:
                if isinstance(event, TextOut):
                    if req.echo and not echoed[i] and not (req.logprobs is not None):
                        yield echo(i, None)
                    if req.echo and not echoed[i]:
                        continue  # the prompt's log-probabilities come with the Done; hold the reply until then
                    lp = None
                    if req.logprobs is not None:
                        lp = completion_logprobs(runtime, event.logprobs, event.token_ids, offsets[i])
                    offsets[i] += len(event.text)
                    yield chunk(i, event.text, lp)
                elif isinstance(event, Failed):
                    error = GENERATION_FAILED if event.done is not None else event.error.body()
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                elif isinstance(event, Finished):
                    done = event.done
                    dones[i] = done
                    if req.echo and not echoed[i]:
                        yield echo(i, done.prompt_logprobs)
                        if done.text:  # the reply, held back until the prompt's log-probabilities were known
                            reply = [lp.token for lp in done.logprobs]
                            lp = completion_logprobs(runtime, done.logprobs, reply, offsets[i])
                            yield chunk(i, done.text, lp if req.logprobs is not None else None)
                    finish = "length" if done.finish_reason == "length" else "stop"
                    usage = _usage(turns, dones, req.n or 1) if len(dones) == len(turns) else None
                    yield chunk(i, "", None, finish, usage)
    yield "data: [DONE]\n\n"
