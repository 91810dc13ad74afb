"""Thinking replies in ``/v1/chat/completions``: ``chat_template_kwargs`` (vLLM's extension; ``enable_thinking``)
reach the template, ``thinking_budget`` (an extension, in tokens) closes the thinking for the model once spent, a
grammar (``response_format``, tools) applies after the thinking, and the reply's thinking comes back as
``reasoning_content`` (``chat.engine.reasoning``).

Checks (a typed 400 naming the field): a ``thinking_budget`` for a model that does not think or with thinking
turned off, or one that leaves no room in the context window; a grammar that cannot follow thinking.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from chat.engine.events import TurnRequest
from chat.engine.reasoning import Markers, after_thinking
from chat.engine.sampling import SamplingParams
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError

_log = logging.getLogger(__name__)


def settle(engine, turn: TurnRequest, markers: Markers | None, plan_can_call: bool, done) -> None:
    """Once a thinking reply is out, compute in the background the conversation as the next request will render it:
    the reply's answer without its thinking (templates drop it, and clients send back only ``content``). The next
    turn then finds that prompt in the cache instead of computing the answer again after a cache hit that ended
    where the thinking began (the turn computes only the answer's tokens: the earlier prompt is cached). Nothing is
    done for replies without thinking, replies that may have called tools, or one that failed or was cut.

    The work is the server's, not a request: a tenant's engine view (``chat.server.tenancy.tenant_gate``) hands over its
    ``unmetered`` engine, so the background turn neither counts against the tenant's concurrent turns (its next step
    would be refused while it runs) nor is charged to its tokens per minute."""
    if markers is None or plan_can_call or done.finish_reason != "stop" or turn.prompt_tokens is not None:
        return
    reasoning, answer = markers.split(done.text)
    if reasoning is None:
        return
    params = SamplingParams(max_tokens=0)  # the prompt only: no reply, its entry stored
    request = replace(turn, messages=[*turn.messages, {"role": "assistant", "content": answer}], params=params)
    engine = getattr(engine, "unmetered", engine)
    try:
        engine.submit(request, lambda _event: None)
    except Exception:  # the engine is closing, or the prompt no longer fits: the next turn computes it
        _log.debug("could not settle a thinking reply's history", exc_info=True)


def thinking_markers(runtime, template_kwargs: dict[str, Any] | None) -> Markers | None:
    """The markers of this request's thinking: None when the model does not think or the request turned it off."""
    markers = getattr(runtime, "reasoning", None)
    if markers is None or (template_kwargs or {}).get("enable_thinking", True) is False:
        return None
    return markers


def apply(turn: TurnRequest, runtime, template_kwargs: dict[str, Any] | None, budget: int | None) -> TurnRequest:
    """``turn`` with the template's variables, its grammar after the thinking, and the thinking budget.

    Raises:
        RequestError: see the module docstring.
    """
    markers = thinking_markers(runtime, template_kwargs)
    if template_kwargs:
        turn = replace(turn, template_kwargs=dict(template_kwargs))
    if budget is not None:
        if markers is None:
            raise RequestError(
                ErrorCode.INVALID_REQUEST,
                "thinking_budget: this model does not think (or enable_thinking is false)",
                param="thinking_budget",
            )
        window = getattr(runtime, "context_window", None)
        if window is not None and budget >= window:
            message = f"thinking_budget: {budget} tokens leave no room in the {window}-token context window"
            raise RequestError(ErrorCode.CONTEXT_OVERFLOW, message, param="thinking_budget")
    if markers is None:
        return turn
    params = turn.params
    if params.grammar is not None:
        try:
            params = replace(params, grammar=after_thinking(markers, params.grammar))
        except ValueError as exc:
            raise RequestError(ErrorCode.INVALID_GRAMMAR, str(exc), param="response_format") from None
    if budget is not None:
        start, end = tuple(runtime.encode(markers.start)), tuple(runtime.encode(markers.end))
        params = replace(params, thinking_budget=budget, thinking_start=start, thinking_end=end)
    return replace(turn, params=params)
