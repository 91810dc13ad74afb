"""`turncache chat`: a terminal chat on the engine (no server). Prints, per turn, the cached tokens, the time to
first token and the decode speed; a thinking model's thinking is printed dimmed, apart from its answer. Commands:
/regen (regenerate the last reply), /reset (new chat), /quit."""

from __future__ import annotations

import sys
from typing import TextIO

from cache import PrefixCache
from chat.engine.events import Delta, Done, TurnRequest
from chat.engine.reasoning import ReasoningSplitter
from chat.engine.runtime import ModelRuntime
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn

DIM, PLAIN = "\x1b[2m", "\x1b[0m"  # thinking is printed dimmed


def chat_loop(
    runtime: ModelRuntime,
    cache: PrefixCache | None,
    params: SamplingParams,
    *,
    system: str | None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
) -> int:
    base = [{"role": "system", "content": system}] if system else []
    messages = list(base)
    print(f"turncache chat: {runtime.name}. /regen regenerates, /reset starts over, /quit leaves.", file=stdout)
    while True:
        print("> ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip() == "/quit":
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            messages = list(base)
            continue
        if text.strip() == "/regen":
            if not messages or messages[-1]["role"] != "assistant":
                print("(nothing to regenerate)", file=stdout)
                continue
            messages.pop()
        elif not text.strip():
            continue
        else:
            messages.append({"role": "user", "content": text})
        done = _turn(runtime, cache, messages, params, stdout)
        if done is None:
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": done.text})


def _turn(runtime, cache, messages, params, stdout) -> Done | None:
    from chat.engine.errors import EngineError

    gen = Turn(runtime, cache, TurnRequest(list(messages), params))
    markers = getattr(runtime, "reasoning", None)
    splitter = ReasoningSplitter(markers) if markers is not None else None
    try:
        while not gen.done:
            for event in gen.step():
                if isinstance(event, Delta):
                    _show(splitter.push(event.text) if splitter else ("", event.text), stdout)
                elif isinstance(event, Done):
                    if splitter is not None:
                        _show(splitter.flush(), stdout)
                    u, t = event.usage, event.timings
                    print(
                        f"\n[{u.cached_tokens:,} of {u.prompt_tokens:,} prompt tokens cached · "
                        f"first token {t.ttft_ms / 1e3:.2f} s · {t.decode_tokens_per_s:.1f} tok/s · "
                        f"{event.finish_reason}]",
                        file=stdout,
                        flush=True,
                    )
                    return event
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
