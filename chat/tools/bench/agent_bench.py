"""`turncache bench agent`: agent loops over HTTP with the official ``openai`` client, and what the cache keeps of
them.

Four workloads, in one process, each on its own loopback server:

1. **Chat completions with tools** on the built-in model (its template has no tools: the generic, constrained JSON
   format): ``loops`` concurrent loops x ``steps`` requests. Each step sends the whole conversation; a reply that
   calls a tool gets a tool result back (a made-up observation), a reply that answers gets the next user question.
   The first step of each loop requires a call (``tool_choice: "required"``: the question asks for the weather),
   the others leave it to the model (``auto``), so every run measures calls, even on a model too small to choose
   them itself.
2. **The same loops through** ``/v1/responses``: each step sends only its new input with ``previous_response_id``.
3. **The same loops over Anthropic's** ``/v1/messages`` (the ``anthropic`` SDK), each step the whole conversation
   with the newest block marked ``cache_control`` (as Claude Code sends it), a call answered by a ``tool_result``.
4. **A thinking model** (``tiny-thinking``, whose template drops the thinking from history, as Qwen3's does): loops
   of multi-turn chat whose replies think (the thinking held to ``thinking_budget`` tokens), then answer with the JSON
   object the application's instructions ask for (``response_format: json_schema`` with their three keys: the
   grammar applies after the thinking), the client sending back each answer without its reasoning.

Keys: ``tool_calls_valid`` (share of tool calls whose arguments parse and validate against their function's schema;
target 1.0), ``tool_calls`` (how many), ``cached_ratio_after_tool`` (cached / prompt tokens over chat-completions
steps 2+; target >= 0.9), ``cached_ratio_responses`` (the same over ``/v1/responses`` steps 2+; target >= 0.95),
``messages_tool_calls_valid`` and ``messages_tool_calls`` (the same over ``/v1/messages``; target 1.0),
``cached_ratio_messages`` (cache_read / prompt tokens over ``/v1/messages`` steps 2+; target >= 0.95),
``cached_ratio_after_thinking`` (turns 2+ of the thinking loops; target >= 0.9), ``reusable_ratio_after_thinking``
(the same steps' share of prompt tokens rendered before the step's new user message, counted by ``POST /tokenize``:
what a cache that kept every earlier turn would reach, so that the figure before it can be judged; the marker that
opens the new message may match too, a token a step more), ``errors``
(failed requests; target 0), ``wall_s_chat``, ``wall_s_responses``, ``wall_s_messages``, ``model``, ``cpu``.
"""

from __future__ import annotations

import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema

from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, in_fresh_thread, leave_parallelism_to_engines

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
LOOKUP = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 60}},
    "required": ["query"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city.", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": LOOKUP}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Perth", "Riga"]
SYSTEM = "You are a helpful travel assistant. Use the tools when they help."
THINKING_SYSTEM = (  # an application's instructions, as agents and apps send them (the chat loops' are the tools')
    "You are a careful travel planner. Think about the traveller's question first: the season, the weather, local "
    "customs, transport and money. Then answer with one JSON object holding your advice: keys 'weather', 'pack', "
    "'tips'. Keep every value short. Never invent prices. If you are unsure, say so in 'tips'. Always consider "
    "what the traveller said earlier in the conversation, and do not repeat advice you already gave."
)
ADVICE = {  # the answer THINKING_SYSTEM asks for, as the application enforces it (``response_format``)
    "type": "object",
    "properties": {key: {"type": "string", "maxLength": 24} for key in ("weather", "pack", "tips")},
    "required": ["weather", "pack", "tips"],
    "additionalProperties": False,
}


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo").read().splitlines():  # noqa: SIM115
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Tally:
    """Counts of one workload (each loop adds to its own, merged after)."""

    def __init__(self) -> None:
        self.cached = 0  # cached prompt tokens on steps 2+
        self.prompt = 0  # prompt tokens on steps 2+
        self.calls = 0  # tool calls seen
        self.valid = 0  # of those, valid for their schema
        self.errors = 0  # failed requests
        self.reusable = 0  # prompt tokens on steps 2+ rendered before the step's new message (thinking loops only)

    def add(self, other: Tally) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    def check(self, name: str, arguments: str) -> None:
        self.calls += 1
        try:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
            self.valid += 1
        except (ValueError, jsonschema.ValidationError, KeyError):
            pass


def _question(i: int, step: int) -> str:
    city = CITIES[(i + step) % len(CITIES)]
    return f"I am planning a trip to {city}. What is the weather there, and what should I pack?"


def _chat_loop(client, model: str, i: int, steps: int, max_tokens: int) -> Tally:
    tally = Tally()
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _question(i, 0)}]
    for step in range(steps):
        try:
            choice = "required" if step == 0 else "auto"
            reply = client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=max_tokens
            )
        except Exception:
            tally.errors += 1
            return tally
        if step > 0:
            tally.cached += reply.usage.prompt_tokens_details.cached_tokens
            tally.prompt += reply.usage.prompt_tokens
        message = reply.choices[0].message
        messages.append(
            message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio", "function_call"})
        )
        if message.tool_calls:
            for call in message.tool_calls:
                tally.check(call.function.name, call.function.arguments)
                result = f"{call.function.name} result: 18 degrees, light rain."
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        else:
            messages.append({"role": "user", "content": _question(i, step + 1)})
    return tally


def _responses_loop(client, model: str, i: int, steps: int, max_tokens: int) -> Tally:
    tally = Tally()
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    previous, new_input = None, [{"role": "user", "content": _question(i, 0)}]
    for step in range(steps):
        try:
            reply = client.responses.create(
                model=model,
                instructions=SYSTEM,
                input=new_input,
                previous_response_id=previous,
                tools=tools,
                tool_choice="required" if step == 0 else "auto",
                temperature=0,
                max_output_tokens=max_tokens,
            )
        except Exception:
            tally.errors += 1
            return tally
        if step > 0:
            tally.cached += reply.usage.input_tokens_details.cached_tokens
            tally.prompt += reply.usage.input_tokens
        previous = reply.id
        calls = [o for o in reply.output if o.type == "function_call"]
        for call in calls:
            tally.check(call.name, call.arguments)
        new_input = [
            {"type": "function_call_output", "call_id": c.call_id, "output": "18 degrees, light rain."} for c in calls
        ] or [{"role": "user", "content": _question(i, step + 1)}]
    return tally


ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


def _messages_loop(client, model: str, i: int, steps: int, max_tokens: int) -> Tally:
    """The chat loop over Anthropic's ``/v1/messages`` (the ``anthropic`` SDK), as Claude Code sends it: the whole
    conversation each step, the newest block marked with ``cache_control``; a call gets a ``tool_result`` back."""
    tally = Tally()
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": _question(i, 0)}]}]
    for step in range(steps):
        sent = [dict(m, content=[dict(b) for b in m["content"]]) for m in messages]
        sent[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}  # the marker moves to the newest block
        try:
            reply = client.messages.create(
                model=model,
                system=SYSTEM,
                messages=sent,
                tools=ANTHROPIC_TOOLS,
                tool_choice={"type": "any" if step == 0 else "auto"},
                max_tokens=max_tokens,
                extra_body={"temperature": 0},
            )
        except Exception:
            tally.errors += 1
            return tally
        if step > 0:
            u = reply.usage
            tally.cached += u.cache_read_input_tokens
            tally.prompt += u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        content = [b.model_dump(exclude_none=True, exclude={"citations", "parsed_output"}) for b in reply.content]
        messages.append({"role": "assistant", "content": content or [{"type": "text", "text": ""}]})
        calls = [b for b in reply.content if b.type == "tool_use"]
        for call in calls:
            tally.check(call.name, json.dumps(call.input))
        results = [{"type": "tool_result", "tool_use_id": c.id, "content": "18 degrees, light rain."} for c in calls]
        messages.append({"role": "user", "content": results or [{"type": "text", "text": _question(i, step + 1)}]})
    return tally


def _thinking_loop(client, model: str, i: int, steps: int) -> Tally:
    import httpx

    tally = Tally()
    root = str(client.base_url).rstrip("/").removesuffix("/v1")  # /tokenize is vLLM's, at the server's root
    messages: list[dict] = [
        {"role": "system", "content": THINKING_SYSTEM},
        {"role": "user", "content": _question(i, 0)},
    ]
    for step in range(steps):
        try:
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                temperature=0,
                max_tokens=160,
                response_format={"type": "json_schema", "json_schema": {"name": "advice", "schema": ADVICE}},
                extra_body={"thinking_budget": 16},
            )
            if step > 0:  # the history before the new question, as the template renders it: all an ideal cache keeps
                history = messages[:-1]
                rendered = httpx.post(
                    f"{root}/tokenize",
                    json={"model": model, "messages": history, "add_generation_prompt": False},
                    timeout=600,
                )
                rendered.raise_for_status()
                tally.reusable += rendered.json()["count"]
        except Exception:
            tally.errors += 1
            return tally
        if step > 0:
            tally.cached += reply.usage.prompt_tokens_details.cached_tokens
            tally.prompt += reply.usage.prompt_tokens
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": _question(i, step + 1)},
        ]
    return tally


def _serve(runtime, work, anthropic_client: bool = False) -> tuple[Tally, float]:
    """Run ``work(client, model)`` against a loopback server over ``runtime`` (an ``openai`` client, or an
    ``anthropic`` one); its tally and wall time."""
    import anthropic
    import openai

    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    engine = Engine(
        runtime, cache=PrefixCache(device_budget_bytes=2 * 1024**3, host_budget_bytes=0), threads=engine_threads()
    )
    try:
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
            if anthropic_client:
                client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=600)
            else:
                client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
            start = time.perf_counter()
            tally = work(client, runtime.name)
            return tally, time.perf_counter() - start
    finally:
        engine.close()


def _concurrently(loops: int, one) -> Tally:
    total = Tally()
    with ThreadPoolExecutor(max_workers=loops) as pool:
        for tally in pool.map(one, range(loops)):
            total.add(tally)
    return total


def run(
    model: str = "smollm2",
    *,
    loops: int = 8,
    steps: int = 6,
    max_tokens: int = 160,
    thinking_model: str = "tiny-thinking",
) -> dict:
    from chat.models import load_model

    leave_parallelism_to_engines()
    runtime = in_fresh_thread(lambda: load_model(model))
    chat, wall_chat = _serve(
        runtime, lambda c, m: _concurrently(loops, lambda i: _chat_loop(c, m, i, steps, max_tokens))
    )
    responses, wall_responses = _serve(
        runtime, lambda c, m: _concurrently(loops, lambda i: _responses_loop(c, m, i, steps, max_tokens))
    )
    messages, wall_messages = _serve(
        runtime, lambda c, m: _concurrently(loops, lambda i: _messages_loop(c, m, i, steps, max_tokens)), True
    )
    thinker = in_fresh_thread(lambda: load_model(thinking_model))
    thinking, _ = _serve(thinker, lambda c, m: _concurrently(loops, lambda i: _thinking_loop(c, m, i, steps)))
    calls = Tally()
    calls.add(chat)
    calls.add(responses)
    return {
        "model": runtime.name,
        "cpu": cpu_name(),
        "loops": loops,
        "steps": steps,
        "tool_calls": calls.calls,
        "tool_calls_valid": calls.valid / calls.calls if calls.calls else 1.0,
        "cached_ratio_after_tool": chat.ratio(),
        "cached_ratio_responses": responses.ratio(),
        "cached_ratio_after_thinking": thinking.ratio(),
        "reusable_ratio_after_thinking": thinking.reusable / thinking.prompt if thinking.prompt else 0.0,
        "messages_tool_calls": messages.calls,
        "messages_tool_calls_valid": messages.valid / messages.calls if messages.calls else 1.0,
        "cached_ratio_messages": messages.ratio(),
        "errors": chat.errors + responses.errors + thinking.errors + messages.errors,
        "wall_s_chat": wall_chat,
        "wall_s_responses": wall_responses,
        "wall_s_messages": wall_messages,
    }


TARGETS = {
    "tool_calls_valid": ("==", 1.0),
    "cached_ratio_after_tool": (">=", 0.9),
    "cached_ratio_responses": (">=", 0.95),
    "cached_ratio_after_thinking": (">=", 0.9),
    "messages_tool_calls_valid": ("==", 1.0),
    "cached_ratio_messages": (">=", 0.95),
    "errors": ("==", 0),
}


def main(as_json: bool, model: str = "smollm2") -> int:
    emit(run(model), TARGETS, as_json)
    return 0
