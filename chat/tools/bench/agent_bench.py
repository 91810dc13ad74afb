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

5. **A Claude-Code-shaped phase** (:func:`claude_code_phase`, on ``tiny-hermes`` with its context widened to 40960):
   a ~25k-token system + tools prefix (two marked system blocks, 24 tools) behind a billing line whose last 3 hex
   characters differ per session, 4 sessions x 4 steps over ``/v1/messages``. ``cached_ratio_cross_session``:
   cache_read / prompt tokens over the first steps of sessions 2-4 (target >= 0.9); ``claude_code_prompt_tokens``:
   the first step's prompt. ``pinned_hit_after_flood``: on a server whose device tier holds 1.5 sessions, a session's
   breakpoints are pinned, other tenants send fresh prompts worth ``flood_bytes_over_budget`` times the device budget
   (4; ``flood_evictions`` entries evicted meanwhile), and a new session reads the pinned system prefix from the
   cache: 1.0 (target), else 0.0. Its errors count in ``errors``; ``wall_s_claude_code``.
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
    claude_code_size: tuple[int, int] | None = None,
) -> dict:
    """``claude_code_size``: (tools, rules repeats) of the Claude-Code-shaped prefix (None: 24 tools, ~25k tokens)."""
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
    start = time.perf_counter()
    claude_code = claude_code_phase(size=claude_code_size or (24, CC_PREFIX_REPEATS))
    wall_claude_code = time.perf_counter() - start
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
        "cached_ratio_cross_session": claude_code["cached_ratio_cross_session"],
        "pinned_hit_after_flood": claude_code["pinned_hit_after_flood"],
        "claude_code_prompt_tokens": claude_code.get("claude_code_prompt_tokens", 0),
        "flood_bytes_over_budget": claude_code["flood_bytes_over_budget"],
        "flood_evictions": claude_code["flood_evictions"],
        "errors": chat.errors
        + responses.errors
        + thinking.errors
        + messages.errors
        + claude_code["errors"]
        + claude_code["errors_claude_code_flood"],
        "wall_s_chat": wall_chat,
        "wall_s_responses": wall_responses,
        "wall_s_messages": wall_messages,
        "wall_s_claude_code": wall_claude_code,
    }


TARGETS = {
    "tool_calls_valid": ("==", 1.0),
    "cached_ratio_after_tool": (">=", 0.9),
    "cached_ratio_responses": (">=", 0.95),
    "cached_ratio_after_thinking": (">=", 0.9),
    "messages_tool_calls_valid": ("==", 1.0),
    "cached_ratio_messages": (">=", 0.95),
    "cached_ratio_cross_session": (">=", 0.9),
    "pinned_hit_after_flood": ("==", 1.0),
    "errors": ("==", 0),
}


def main(as_json: bool, model: str = "smollm2") -> int:
    emit(run(model), TARGETS, as_json)
    return 0


# --- a Claude-Code-shaped phase: a long shared prefix, a volatile first line, breakpoints that hold -------------

CC_MODEL = "tiny-hermes"  # a template that renders tools in the system prompt, as Claude Code's targets do
CC_CONTEXT = 40960  # the tiny model's context, widened (4096 as built) so that the ~25k-token prefix fits
CC_PREFIX_REPEATS = 130  # repeats of the rules paragraph: with the 24 tools (~14.7k tokens), a prefix of ~25k tokens
CC_RULES = (
    "Read a file before you edit it. Prefer small, reviewable changes and run the tests after each one. "
    "Never commit secrets. "
)


def _cc_tools(count: int = 24) -> list[dict]:
    """``count`` tools with JSON schemas, as Claude Code sends 24 (names and schemas made up)."""
    tools = []
    for i in range(count):
        props = {f"arg_{k}": {"type": "string", "description": f"argument {k} of tool {i}"} for k in range(6)}
        tools.append(
            {
                "name": f"Tool{i}",
                "description": f"Tool number {i}: does one kind of thing to the workspace. " * 4,
                "input_schema": {"type": "object", "properties": props, "required": ["arg_0"]},
            }
        )
    return tools


def _cc_body(session: int, history: list[dict], size: tuple[int, int] = (24, CC_PREFIX_REPEATS)) -> dict:
    """One step of a Claude Code session: the billing line (its last 3 hex characters per session), two marked
    system blocks, 24 tools, the conversation with its newest block marked."""
    cc = {"type": "ephemeral"}
    billing = (
        f"x-anthropic-billing-header: cc_version=2.1.197.{session * 2654435761 % 4096:03x}; cc_entrypoint=sdk-cli;"
    )
    sent = [dict(m, content=[dict(b) for b in m["content"]]) for m in history]
    sent[-1]["content"][-1]["cache_control"] = cc
    return {
        "model": CC_MODEL,
        "max_tokens": 8,
        "system": [
            {"type": "text", "text": billing},
            {"type": "text", "text": "You are Claude Code, a coding agent.", "cache_control": cc},
            {"type": "text", "text": CC_RULES * size[1], "cache_control": cc},
        ],
        "tools": _cc_tools(size[0]),
        "messages": sent,
        "temperature": 0,
    }


def _cc_step(client, url: str, session: int, history: list[dict], size: tuple[int, int]) -> dict:
    r = client.post(f"{url}/v1/messages?beta=true", json=_cc_body(session, history, size))
    r.raise_for_status()
    reply = r.json()
    text = "".join(b.get("text", "") for b in reply["content"] if b["type"] == "text") or "ok"
    history.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    return reply["usage"]


def _cc_engine(runtime, device_bytes: int):
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.engine.volatile_lines import VolatileLines

    cache = PrefixCache(device_budget_bytes=device_bytes, host_budget_bytes=0)
    return Engine(runtime, cache=cache, threads=engine_threads(), volatile=VolatileLines())


def claude_code_phase(
    sessions: int = 4, steps: int = 4, flood_times: int = 4, size: tuple[int, int] = (24, CC_PREFIX_REPEATS)
) -> dict:
    """``sessions`` sessions x ``steps`` steps, one after another, over ``/v1/messages`` on a server with the default
    volatile lines: ``cached_ratio_cross_session`` is cache_read / prompt tokens over the first steps of sessions 2+.
    Then, on a server whose device tier holds a little more than one session: a session pins its prefix, other
    tenants (their own bearer tokens) send fresh prompts until they have inserted ``flood_times`` times the device
    budget, and ``pinned_hit_after_flood`` is 1.0 if a new session then reads the pinned system prefix from the cache
    (0.0 if not). ``size``: (tools, repeats of the rules paragraph) of the prefix (tests make it small)."""
    import httpx

    from chat.models import load_model
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    runtime = in_fresh_thread(lambda: load_model(CC_MODEL))
    runtime.context_window = CC_CONTEXT
    out = {"errors": 0}
    engine = _cc_engine(runtime, 2 * 1024**3)
    cached = prompt = 0
    try:
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
            client = httpx.Client(timeout=600)
            for s in range(sessions):
                history = [{"role": "user", "content": [{"type": "text", "text": f"Session {s}: fix bug {s}."}]}]
                for step in range(steps):
                    try:
                        u = _cc_step(client, server.url, s, history, size)
                    except httpx.HTTPError:
                        out["errors"] += 1
                        break
                    total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
                    if step == 0:
                        out.setdefault("claude_code_prompt_tokens", total)
                        if s > 0:
                            cached += u["cache_read_input_tokens"]
                            prompt += total
                    history.append({"role": "user", "content": [{"type": "text", "text": f"Step {step + 1}: go on."}]})
    finally:
        engine.close()
    out["cached_ratio_cross_session"] = cached / prompt if prompt else 0.0
    out.update(_pinned_after_flood(runtime, flood_times, size))
    return out


def _pinned_after_flood(runtime, flood_times: int, size: tuple[int, int]) -> dict:
    import httpx

    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    probe = _cc_engine(runtime, 2 * 1024**3)  # the bytes of one session's entry, to size the device tier
    try:
        with BackgroundServer(create_app(probe, ServerSettings(), model_name=runtime.name)) as server:
            _cc_step(
                httpx.Client(timeout=600),
                server.url,
                0,
                [{"role": "user", "content": [{"type": "text", "text": "size"}]}],
                size,
            )
        entry_bytes = probe.cache.stats().bytes_per_tier["device"]
    finally:
        probe.close()
    budget = entry_bytes * 3 // 2
    engine = _cc_engine(runtime, budget)
    errors, hit, flooded, pins = 0, 0.0, 0, 0
    try:
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
            client = httpx.Client(timeout=600)
            history = [{"role": "user", "content": [{"type": "text", "text": "Pin me."}]}]
            first = _cc_step(client, server.url, 1, history, size)
            marks = first["turncache"].get("breakpoints") or []
            pins = sum(1 for m in marks if m["pinned"])
            system_tokens = max((m["tokens"] for m in marks if m["where"].startswith("system")), default=0)
            evictions_before = engine.cache.stats().evictions
            k, words = 0, max(20, first_total(first) // 36)  # prompts of about an eighth of a session each
            while flooded < flood_times * budget:  # other tenants' fresh prompts
                body = {
                    "model": CC_MODEL,
                    "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"flood {k}: " + f"unrelated text {k} " * words}],
                }
                headers = {"authorization": f"Bearer flood-tenant-{k % 4}"}
                r = client.post(f"{server.url}/v1/messages", json=body, headers=headers)
                if r.status_code != 200:
                    errors += 1
                    break
                u = r.json()["usage"]
                flooded += (u["input_tokens"] + u["cache_creation_input_tokens"]) * entry_bytes // first_total(first)
                k += 1
            evicted = engine.cache.stats().evictions - evictions_before
            again = _cc_step(
                client, server.url, 2, [{"role": "user", "content": [{"type": "text", "text": "New."}]}], size
            )
            hit = 1.0 if system_tokens and again["cache_read_input_tokens"] >= system_tokens else 0.0
    except httpx.HTTPError:
        errors += 1
        evicted = 0
    finally:
        engine.close()
    return {
        "pinned_hit_after_flood": hit,
        "flood_bytes_over_budget": round(flooded / budget, 2) if budget else 0.0,
        "flood_evictions": evicted,
        "pins_made_before_flood": pins,
        "errors_claude_code_flood": errors,
    }


def first_total(usage: dict) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
