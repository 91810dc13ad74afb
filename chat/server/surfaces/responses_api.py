"""OpenAI's Responses API: ``POST /v1/responses`` (streaming or not), ``GET`` and ``DELETE /v1/responses/{id}``.

A request is turned into the chat request it amounts to and served by the chat machinery (``openai_api``): the same
sampling fields, tools (function tools, in the Responses shape), structured output (``text.format``), reasoning and
refusals. ``input`` is a string or a list of items: messages (``input_text``, ``input_image`` as a data URL,
``output_text`` of earlier replies), ``function_call`` and ``function_call_output``; ``reasoning`` items are taken
and dropped (templates render the history without its thinking). ``instructions`` become the system message of
this request only. With ``store`` (the default) the response is kept (``chat.server.persistence.response_store``) and
``previous_response_id`` continues its conversation: an agent step sends only its new input, the prompt is the whole
conversation rendered as before, and the prefix cache serves all of it but the new input. A response of another
tenant, or one no longer kept, is 404 ``not_found``. The response object and the stream's events are the typed wire
models of ``responses_types``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chat.engine.events import Done, TurnRequest
from chat.protocol.client_events import ModelName
from chat.protocol.errors import ErrorCode
from chat.server.errors import RequestError, validation_error
from chat.server.persistence.response_store import ResponseStore, StoredResponse
from chat.server.reply import tools_api
from chat.server.reply.reader import Failed, Finished, Prepared, ReasoningOut, TextOut, open_replies, whole_replies
from chat.server.reply.turns import wire_usage
from chat.server.surfaces import openai_api
from chat.server.surfaces import responses_types as wire
from chat.server.surfaces.openai_api import ChatCompletionRequest, refuse_unsupported
from chat.server.surfaces.openai_types import PromptTokensDetails


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(max_length=128)] | None = None
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None  # kept and returned
    truncation: Literal["disabled"] | None = None  # "auto" (dropping old turns) is not done here
    stream_options: dict[str, Any] | None = None
    # the Responses API's fields this server does not honour: refused unless neutral
    reasoning: Any = None
    include: Any = None
    top_logprobs: Any = None
    background: Any = None
    conversation: Any = None
    prompt: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    max_tool_calls: Any = None
    user: Any = None

    def check(self) -> None:
        """Raises RequestError: a field not honoured (``unsupported_parameter``), or ``reasoning`` that is no object
        (``invalid_request``)."""
        refuse_unsupported(self, _UNSUPPORTED)
        if self.reasoning is not None and not isinstance(self.reasoning, dict):
            raise RequestError(ErrorCode.INVALID_REQUEST, "reasoning must be an object", param="reasoning")
        if self.reasoning is not None and any(v is not None for v in self.reasoning.values()):
            raise RequestError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                "reasoning is not supported (thinking models think by default; see docs/openai.md)",
                param="reasoning",
            )


_UNSUPPORTED = (
    "include",
    "top_logprobs",
    "background",
    "conversation",
    "prompt",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "max_tool_calls",
    "user",
)


def _bad(message: str, param: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> RequestError:
    return RequestError(code, f"{param}: {message}", param=param)


def _content(parts: Any, where: str) -> Any:
    """A message's content in the chat API's shape."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise _bad("must be a string or a list of content parts", where)
    out = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            out.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _bad("input_image needs image_url (a data URL; file ids are not supported)", f"{where}.{j}")
            out.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise RequestError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"{where}.{j}: content type {kind!r} is not supported",
                param=f"{where}.{j}",
            )
    return out


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as chat messages (function calls merged into one assistant message per run of calls).

    Raises:
        RequestError: an item of an unknown or unsupported type.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input.{i}"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad("role must be user, system, developer or assistant", f"{where}.role")
            out.append({"role": role, "content": _content(item.get("content", ""), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last.get("content"):
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # the history is rendered without its thinking
        else:
            raise RequestError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"{where}.type: item type {kind!r} is not supported",
                param=f"{where}.type",
            )
    return out


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise RequestError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"tools.{i}.type: only function tools are supported",
                param=f"tools.{i}.type",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise RequestError(
                ErrorCode.UNKNOWN_PARAMETER, f"tools.{i}: unknown fields {sorted(extra)}", param=f"tools.{i}"
            )
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format``. Raises RequestError: a format that is no object."""
    fmt = (text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise RequestError(ErrorCode.INVALID_REQUEST, "text.format must be an object", param="text.format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt.get("type")}


def to_chat(req: ResponsesRequest, history: Sequence[dict[str, Any]]) -> tuple[ChatCompletionRequest, list[dict]]:
    """The chat request this request amounts to, and the conversation it continues with (history + input).

    Raises:
        RequestError: anything the chat API refuses, named as far as it can be.
    """
    conversation = [*history, *input_messages(req.input)]
    head = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {
        "messages": [*head, *conversation],
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_tokens": req.max_output_tokens,
        "tools": _tools(req.tools),
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _format(req.text),
    }
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        raise validation_error(list(exc.errors())) from None
    return chat, conversation


def prepare(
    req: ResponsesRequest, history: Sequence[dict[str, Any]], salt: str, runtime, *, reply_cap: int | None, max_n: int
) -> tuple[Prepared, list[dict]]:
    """The request as the pipeline runs it (the chat request it amounts to), and the conversation it continues.

    Raises:
        RequestError, UnsupportedMediaError, SamplingFieldError.
    """
    chat, conversation = to_chat(req, history)
    chat.check(max_n)
    return openai_api.prepare(chat, salt, runtime, reply_cap), conversation


def output_items(finished: Finished) -> list[wire.OutputItem]:
    """The ``output`` of a finished reply: its reasoning, its message, its function calls."""
    items: list[wire.OutputItem] = []
    if finished.reasoning:
        text = [wire.ReasoningText(text=finished.reasoning)]
        items.append(wire.ReasoningItem(id=f"rs_{uuid.uuid4().hex}", content=text))
    if finished.content:
        content = [wire.OutputText(text=finished.content)]
        items.append(wire.OutputMessage(id=f"msg_{uuid.uuid4().hex}", status="completed", content=content))
    for call in tools_api.wire_calls(finished.calls):
        function = call["function"]
        items.append(
            wire.FunctionCallItem(
                id=f"fc_{uuid.uuid4().hex}",
                call_id=call["id"],
                name=function["name"],
                arguments=function["arguments"],
                status="completed",
            )
        )
    return items


def _as_messages(items: Sequence[wire.OutputItem]) -> list[dict[str, Any]]:
    """A response's output as the chat messages that continue the conversation."""
    text = "".join(c.text for i in items if isinstance(i, wire.OutputMessage) for c in i.content)
    calls = [
        {"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.arguments}}
        for i in items
        if isinstance(i, wire.FunctionCallItem)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _usage(done: Done) -> wire.ResponseUsage:
    u = wire_usage(done)
    details = u.prompt_tokens_details
    return wire.ResponseUsage(
        input_tokens=u.prompt_tokens,
        input_tokens_details=PromptTokensDetails(
            cached_tokens=details.cached_tokens,
            cache_miss_reason=details.cache_miss_reason,
            cache_miss_at=details.cache_miss_at,
        ),
        output_tokens=u.completion_tokens,
        output_tokens_details=wire.OutputTokensDetails(),
        total_tokens=u.total_tokens,
    )


def response_object(
    rid: str, req: ResponsesRequest, model: str, items: list[wire.OutputItem], done: Done | None, created: int
) -> wire.Response:
    """The response object (``status`` in_progress until ``done``)."""
    status = "in_progress" if done is None else "incomplete" if done.finish_reason == "length" else "completed"
    return wire.Response(
        id=rid,
        created_at=created,
        status=status,
        incomplete_details=wire.IncompleteDetails() if status == "incomplete" else None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        model=model,
        output=items,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        previous_response_id=req.previous_response_id,
        store=req.store is not False,
        temperature=req.temperature,
        text=req.text or wire.TextConfig(),
        tool_choice=req.tool_choice or "auto",
        tools=req.tools or [],
        top_p=req.top_p,
        usage=_usage(done) if done is not None else None,
        metadata=req.metadata or {},
    )


def _keep(store: ResponseStore, req: ResponsesRequest, tenant: str, conversation, body: wire.Response) -> None:
    if req.store is not False:
        messages = (*conversation, *_as_messages(body.output))
        store.put(body.id, StoredResponse(tenant, tuple(messages), wire.plain(body)))


async def complete(engine, turn: TurnRequest, req, model, plan, markers, store, tenant, conversation) -> Response:
    (finished,) = await whole_replies(engine, Prepared([turn], plan, markers))
    body = response_object(
        f"resp_{uuid.uuid4().hex}", req, model, output_items(finished), finished.done, int(time.time())
    )
    _keep(store, req, tenant, conversation, body)
    return Response(wire.compact(body), media_type="application/json")


def deleted(response_id: str) -> Response:
    """The answer to ``DELETE /v1/responses/{id}`` once the response is deleted."""
    return Response(wire.compact(wire.ResponseDeleted(id=response_id)), media_type="application/json")


async def stream(
    engine, turn, req, model, plan, markers, store, tenant, conversation, *, max_pending: int | None = None
) -> AsyncIterator[str]:
    """Server-sent events of a streamed response (``response.created`` ... ``response.completed``); the first engine
    batch is awaited before this returns. A reply that may call tools is sent whole once it is done. A client that
    falls behind reading pauses the turn; ``max_pending`` events left unread all the same end the stream with an
    ``error`` event whose code is ``slow_client`` (chat.server.transport.backpressure).

    Raises:
        whatever the turn raised before computing anything.
    """
    replies = await open_replies(engine, Prepared([turn], plan, markers), max_pending=max_pending)
    held = plan is not None and plan.calls_possible
    return _sse(replies, held, req, model, store, tenant, conversation)


async def _sse(replies, held: bool, req, model, store, tenant, conversation) -> AsyncIterator[str]:
    """The Responses surface's encoder: reply events -> ``response.*`` events (the thinking is not streamed)."""
    rid, created = f"resp_{uuid.uuid4().hex}", int(time.time())
    msg_id, opened = f"msg_{uuid.uuid4().hex}", False
    thought, reasoning = False, None  # the reply thought; its reasoning item, once announced (ahead of the message)
    writer = wire.EventWriter(msg_id)
    event, text_delta = writer.event, writer.text_delta
    yield event(wire.ResponseCreated, response=response_object(rid, req, model, [], None, created))
    yield event(wire.ResponseInProgress, response=response_object(rid, req, model, [], None, created))
    async with contextlib.aclosing(replies):
        async for batch in replies:
            for _, item in batch:
                if isinstance(item, ReasoningOut):
                    thought = True
                    continue  # the thinking is not streamed: it comes whole in its item, output 0
                if isinstance(item, TextOut) and held:
                    continue  # sent whole with its calls, below
                if isinstance(item, TextOut) and not opened and item.text:
                    opened = True
                    if thought:  # the reasoning item stands before the message: announced now, done at the end
                        reasoning = wire.ReasoningItem(id=f"rs_{uuid.uuid4().hex}", content=[], status="in_progress")
                        yield event(wire.OutputItemAdded, output_index=0, item=reasoning)
                        writer.message_at(1)
                    at = writer.message_index
                    message = wire.OutputMessage(id=msg_id, status="in_progress", content=[])
                    yield event(wire.OutputItemAdded, output_index=at, item=message)
                    part = wire.OutputText(text="", logprobs=None)
                    yield event(wire.ContentPartAdded, item_id=msg_id, output_index=at, content_index=0, part=part)
                if isinstance(item, TextOut) and item.text:
                    yield text_delta(item.text)
                elif isinstance(item, Failed):
                    if item.done is not None:
                        code, message = "server_error", "generation failed; the server logged the details"
                    else:
                        code, message = item.error.code.value, str(item.error)
                    yield event(wire.ErrorEvent, code=code, message=message)
                    return
                elif isinstance(item, Finished):
                    items = output_items(item)
                    if reasoning is not None:  # announced: the same item (its id), first, whatever the text
                        if items and isinstance(items[0], wire.ReasoningItem):
                            items[0].id = reasoning.id
                        else:
                            items.insert(0, wire.ReasoningItem(id=reasoning.id, content=[]))
                    for n, out in enumerate(items):
                        is_message = isinstance(out, wire.OutputMessage)
                        if is_message:
                            out.id = msg_id
                        announced = (opened and is_message) or (reasoning is not None and n == 0)
                        if not announced:
                            yield event(wire.OutputItemAdded, output_index=n, item=replace(out, status="in_progress"))
                        if is_message:
                            done_part = out.content[0]
                            if not opened:
                                part = wire.OutputText(text="", logprobs=None)
                                yield event(
                                    wire.ContentPartAdded, item_id=msg_id, output_index=n, content_index=0, part=part
                                )
                                yield event(
                                    wire.OutputTextDelta,
                                    item_id=msg_id,
                                    output_index=n,
                                    content_index=0,
                                    delta=done_part.text,
                                )
                            yield event(
                                wire.OutputTextDone,
                                item_id=msg_id,
                                output_index=n,
                                content_index=0,
                                text=done_part.text,
                            )
                            yield event(
                                wire.ContentPartDone, item_id=msg_id, output_index=n, content_index=0, part=done_part
                            )
                        if isinstance(out, wire.FunctionCallItem):
                            yield event(
                                wire.FunctionCallArgumentsDone, item_id=out.id, output_index=n, arguments=out.arguments
                            )
                        yield event(wire.OutputItemDone, output_index=n, item=out)
                    body = response_object(rid, req, model, items, item.done, created)
                    _keep(store, req, tenant, conversation, body)
                    yield event(wire.ResponseCompleted, response=body)
                    return
