"""A session with one new photo per turn, through the path a WebSocket turn takes: the ``turn.create`` frame is
parsed and validated by the protocol (each photo's base64 decoded and hashed there, once), kept in the session's
stored messages, turned into the engine's request by ``chat.server.reply.turns``, then rendered and answered by the
engine. Per turn it reports:

- ``request_ms_per_turn``: from the frame to the engine's request (parse and validate the frame, plan the turn,
  build the request): what a WebSocket turn does before the engine's clock starts;
- ``render_ms_per_turn``: time in ``render_prompt`` (the chat template, tokenizing, and each media item's identity
  and preparation: only the new photo is decoded and prepared, earlier ones are found by their kept digest);
- ``ttft_ms_per_turn``: the turn's time to its first token (render, cache lookup, restore, prefill of the new
  tokens, first sample).

With each item's digest kept with its stored message, neither grows with the number of earlier photos (the template
and the tokenizer still see the whole conversation: that part grows with its text).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

TURNS = 20
REPLY_TOKENS = 8


def run(runtime: Any, turns: int = TURNS) -> dict[str, Any]:
    """Run the session on ``runtime`` (a model that takes images) with a fresh prefix cache; return the figures."""
    from cache import PrefixCache
    from chat.engine.turn import Turn, run_to_end
    from chat.protocol.parser import parse_client_event
    from chat.protocol.sampling import SamplingSettings
    from chat.protocol.session import Session
    from chat.server.reply.turns import turn_request, wire_timings, wire_usage
    from chat.tools.bench.media_samples import photo

    settings = SamplingSettings(temperature=0.0, max_tokens=REPLY_TOKENS)
    session = Session(runtime.name, system="Compare each photo with the ones before.", sampling=settings)
    cache = PrefixCache()
    renders: list[float] = []
    render = runtime.render_prompt

    def timed_render(messages, **options):
        start = time.perf_counter()
        try:
            return render(messages, **options)
        finally:
            renders.append((time.perf_counter() - start) * 1e3)

    runtime.render_prompt = timed_render  # this instance only, for the session below
    ttfts: list[float] = []
    requests: list[float] = []
    photo_bytes = 0
    try:
        for n in range(turns):
            data = photo(100 + n)
            photo_bytes += len(data)
            url = "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
            frame = json.dumps(
                {
                    "type": "turn.create",
                    "content": [{"type": "text", "text": f"Photo {n + 1}: what changed?"}, image_url(url)],
                }
            )
            start = time.perf_counter()
            plan = session.create_turn(parse_client_event(frame))
            request = turn_request(plan.messages, plan.sampling, salt="", runtime=runtime)
            requests.append((time.perf_counter() - start) * 1e3)
            _, done = run_to_end(Turn(runtime, cache, request))
            if done.error is not None:
                raise done.error
            session.on_done(plan.turn_id, done.text, done.finish_reason, wire_usage(done), wire_timings(done))
            ttfts.append(done.timings.ttft_ms)
    finally:
        del runtime.render_prompt
    return {
        "session_turns": turns,
        "session_photo_kib": round(photo_bytes / turns / 1024, 1),
        "request_ms_per_turn": [round(ms, 3) for ms in requests],
        "render_ms_per_turn": [round(ms, 3) for ms in renders],
        "ttft_ms_per_turn": [round(ms, 3) for ms in ttfts],
    }


def image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}
