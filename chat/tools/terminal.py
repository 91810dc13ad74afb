"""`turncache chat`: a terminal chat on the engine (no server). Prints, per turn, the cached tokens, the time to
first token and the decode speed; a thinking model's thinking is printed dimmed, apart from its answer. With
``--tools FILE`` (a JSON list of OpenAI function definitions) the model may call them, as over HTTP and the WebSocket
(``chat.server.reply.tools_api``): a reply that may call is printed once it is done, each call on its own line, in cyan
(``⚙ name(arguments)``), and the terminal asks for each call's result, then generates the reply that follows them.
Commands: /regen (regenerate the last reply), /reset (new chat), /quit."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TextIO

from cache import PrefixCache
from chat.engine.events import Delta, Done, TurnRequest
from chat.engine.reasoning import ReasoningSplitter
from chat.engine.runtime import ModelRuntime
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn
from chat.protocol.content import PromptMessage
from chat.protocol.tools import AssistantToolCall, ToolDef

DIM, PLAIN = "\x1b[2m", "\x1b[0m"  # thinking is printed dimmed
CALL = "\x1b[36m"  # tool calls are printed in cyan


def chat_loop(
    runtime: ModelRuntime,
    cache: PrefixCache | None,
    params: SamplingParams,
    *,
    system: str | None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    tools: list[dict] | None = None,
) -> int:
    """Chat until /quit or the end of ``stdin``. ``tools``: OpenAI function definitions the model may call.

    Raises:
        RequestError: ``tools`` cannot be offered (a schema that is not JSON Schema, two functions of one name).
    """
    from chat.server.reply import tools_api

    offered = [ToolDef.model_validate(t) for t in tools or ()]
    plan = tools_api.plan_tools(offered, None, None, runtime)
    base = [PromptMessage("system", system)] if system else []
    messages = list(base)
    print(f"turncache chat: {runtime.name}. /regen regenerates, /reset starts over, /quit leaves.", file=stdout)
    while True:
        if not messages or messages[-1].role != "assistant" or not messages[-1].tool_calls:
            print("> ", end="", file=stdout, flush=True)
            line = stdin.readline()
            if not line or line.strip() == "/quit":
                return 0
            text = line.rstrip("\n")
            if text.strip() == "/reset":
                messages = list(base)
                continue
            if text.strip() == "/regen":
                if not messages or messages[-1].role != "assistant":
                    print("(nothing to regenerate)", file=stdout)
                    continue
                messages.pop()
            elif not text.strip():
                continue
            else:
                messages.append(PromptMessage("user", text))
        else:  # the last reply called tools: ask for their results, then go on
            results = _ask_results(messages[-1].tool_calls, stdin, stdout)
            if results is None:
                return 0
            messages += results
        reply = _turn(runtime, cache, messages, params, stdout, plan)
        if reply is None:
            while messages and messages[-1].role in ("user", "tool"):
                messages.pop()  # a failed turn leaves the conversation as it was
            continue
        messages.append(reply)


def _ask_results(calls, stdin, stdout) -> list[PromptMessage] | None:
    """A tool message per call, its content read from ``stdin``; None at the end of the input."""
    results = []
    for call in calls:
        print(f"{CALL}result of {call.function.name} [{call.id}]>{PLAIN} ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line:
            return None
        results.append(PromptMessage("tool", line.rstrip("\n"), tool_call_id=call.id))
    return results


def _turn(runtime, cache, messages, params, stdout, plan) -> PromptMessage | None:
    """Generate and print one reply; return it as the conversation keeps it (None when it failed)."""
    from chat.engine.errors import EngineError
    from chat.server.reply import tools_api

    plain = [{"role": m.role, "content": m.content} for m in messages]
    request = tools_api.apply(plan, TurnRequest(plain, params), tools_api.history_calls(messages))
    gen = Turn(runtime, cache, request)
    markers = getattr(runtime, "reasoning", None)
    splitter = ReasoningSplitter(markers) if markers is not None else None
    held = plan.calls_possible  # a reply that may call tools is read back whole, then printed
    try:
        while not gen.done:
            for event in gen.step():
                if isinstance(event, Delta):
                    pieces = splitter.push(event.text) if splitter else ("", event.text)
                    _show((pieces[0], "" if held else pieces[1]), stdout)
                elif isinstance(event, Done):
                    if splitter is not None:
                        thought, rest = splitter.flush()
                        _show((thought, "" if held else rest), stdout)
                    reply = _reply(plan, markers, event, stdout) if held else PromptMessage("assistant", event.text)
                    u, t = event.usage, event.timings
                    print(
                        f"\n[{u.cached_tokens:,} of {u.prompt_tokens:,} prompt tokens cached · "
                        f"first token {t.ttft_ms / 1e3:.2f} s · {t.decode_tokens_per_s:.1f} tok/s · "
                        f"{event.finish_reason}]",
                        file=stdout,
                        flush=True,
                    )
                    return reply
    except EngineError as exc:
        print(f"[error: {exc}]", file=stdout, flush=True)
    except KeyboardInterrupt:
        gen.stop("cancelled")
        print("\n[cancelled]", file=stdout, flush=True)
    return None


def _show(pieces: tuple[str, str], stdout) -> None:
    thought, text = pieces
    if thought:
        print(f"{DIM}{thought}{PLAIN}", end="", file=stdout, flush=True)
    if text:
        print(text, end="", file=stdout, flush=True)


def _reply(plan, markers, done: Done, stdout) -> PromptMessage:
    """A reply that may have called tools, read back (as the servers do), printed: its text, then its calls."""
    from chat.server.reply import tools_api

    answer = markers.split(done.text)[1] if markers is not None else done.text
    parsed, _ = tools_api.read_reply(plan, replace(done, text=answer))
    if parsed.content:
        print(parsed.content, end="", file=stdout, flush=True)
    calls = tuple(AssistantToolCall.model_validate(c) for c in tools_api.wire_calls(parsed.calls))
    for call in calls:
        print(f"\n{CALL}⚙ {call.function.name}({call.function.arguments}) [{call.id}]{PLAIN}", end="", file=stdout)
    return PromptMessage("assistant", parsed.content or "", calls)
