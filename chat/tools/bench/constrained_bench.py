"""`turncache bench constrained`: constrained decoding, log-probabilities and loglikelihood requests over HTTP on a
real server on loopback, one run.

The model loads in the engine's worker (:meth:`Engine.load`); the app is served in-process by uvicorn
(:class:`BackgroundServer`) and driven by an asyncio HTTP client (httpx, non-streaming requests). After a warm-up
(one constrained and one plain request: the compiler's token table, the grammar, first-call costs):

- *Grammar compile*: ``schemas`` (10) distinct small JSON schemas compiled through the engine's compiler
  (``engine.grammars().compile(GrammarSpec("json_schema", canonical_json(schema), strict=True))``), first use
  (``grammar_compile_ms``, p50) and again, found compiled (``grammar_cached_ms``, p50).
- *Throughput*: ``conversations`` (8) concurrent chat completions, each a different short question about a person,
  a city or a product, greedy, ``max_tokens`` 96, with ``response_format`` a strict JSON schema (3-4 required
  properties, ``additionalProperties: false``), then the same conversations without it; the two phases alternate
  twice (constrained, plain, constrained, plain) and each reports the median over its rounds of the aggregate rate
  (completion tokens of all conversations over the phase's wall time). Every round's system message starts with a
  tag of its own, so no phase finds another's prompts in the prefix cache. The plain phase asks each conversation
  for at most as many tokens as its constrained reply of the same round had (the JSON answers are short, ~25
  tokens, where free text runs to ``max_tokens``): both phases then do the same work, one prompt and about the same
  number of reply tokens per conversation, and the ratio measures what the grammar costs, not how the prompt's
  cost spreads over replies of other lengths.
- *Validity*: of the constrained replies that ended by themselves (``finish_reason: "stop"``), the share whose
  content parses with ``json.loads`` and validates against the schema with ``jsonschema`` (``json_valid``); replies
  cut by ``max_tokens`` are counted apart (``json_cut_by_length``).
- *Loglikelihood*: ``loglikelihood_requests`` (32) ``POST /v1/completions`` with ``echo``, ``max_tokens: 1``,
  ``logprobs: 1``, ``temperature: 0`` and a ~60-token prompt given as token ids (what lm-eval's
  ``local-completions`` sends), 4 in flight at once; requests per second.
- *Log-probabilities with and without the cache*: a two-turn conversation asked with ``logprobs: true,
  top_logprobs: 5`` twice on this server (the second time its prefix is cached: ``logprob_cached_tokens``), then once
  on a second server whose engine has no prefix cache, over the same runtime (the first engine is closed first: one
  torch pool at a time, see :mod:`chat.tools.bench.threads`). ``logprob_max_abs_diff_cache_vs_none``: the largest
  difference of any token's log-probability or of its top alternatives' between the cached and the uncached reply;
  ``same_tokens``: both replies chose the same tokens and listed the same alternatives.

Keys: ``model``, ``date``, ``cpu``, ``conversations``, ``rounds``, ``max_tokens``, ``constrained_tokens_per_s``,
``unconstrained_tokens_per_s``, ``constrained_tokens_per_s_ratio`` (constrained / unconstrained),
``constrained_completion_tokens`` / ``unconstrained_completion_tokens`` (completion tokens of one round, median),
``constrained_replies``, ``json_valid``, ``json_cut_by_length``, ``grammar_schemas``, ``grammar_compile_ms``,
``grammar_cached_ms``, ``loglikelihood_requests``, ``loglikelihood_requests_per_s``, ``loglikelihood_malformed``
(replies without one log-probability per prompt token plus one for the generated token, as lm-eval's ``[ctxlen:-1]``
slice assumes), ``logprob_cached_tokens``, ``logprob_tokens``, ``logprob_max_abs_diff_cache_vs_none``,
``same_tokens``, ``errors`` (non-200 responses and exceptions, all parts), ``error_samples`` (the first few, as
text), ``wall_s``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chat.tools.bench.report import emit
from chat.tools.bench.threads import engine_threads, leave_parallelism_to_engines

GiB = 1024 * 1024 * 1024
SUBJECTS = (
    ("person", "Marie Curie"),
    ("city", "Lisbon"),
    ("product", "the Nintendo Game Boy"),
    ("person", "Alan Turing"),
    ("city", "Kyoto"),
    ("product", "the Sony Walkman"),
    ("person", "Ada Lovelace"),
    ("city", "Buenos Aires"),
    ("product", "the Swiss Army knife"),
    ("person", "Nelson Mandela"),
    ("city", "Reykjavik"),
    ("product", "the Rubik's Cube"),
)
QUESTION = "Tell me about {name}: what is it called, what kind of thing is it, is it famous, and what year is it from?"
SYSTEM = "You are a helpful assistant. Answer in JSON with the keys name, kind, famous and year."
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "kind": {"enum": ["person", "city", "product"]},
        "famous": {"type": "boolean"},
        "year": {"type": "integer", "minimum": 0, "maximum": 2100},
    },
    "required": ["name", "kind", "famous", "year"],
    "additionalProperties": False,
}
LOGPROB_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And what is the capital of Italy?"},
]
LOGLIKELIHOOD_TEXT = (
    "Question {i}: a train leaves the station at {h} o'clock and travels {k} kilometres at a steady speed of "
    "{s} kilometres an hour. At what time does it arrive, and how many stops could it make on the way if each "
    "stop takes ten minutes? Answer: it arrives"
)


@dataclass
class Tally:
    """Errors of the whole run: their count and the first few messages."""

    count: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.count += 1
        if len(self.samples) < 5:
            self.samples.append(what[:300])


@dataclass
class Reply:
    content: str
    finish_reason: str
    completion_tokens: int


def compile_schemas(n: int) -> list[dict]:
    """``n`` distinct small object schemas (3-4 required properties), none equal to :data:`SCHEMA`."""
    kinds = ("book", "movie", "river", "planet", "painting", "song", "ship", "bridge", "language", "mountain")
    out = []
    for i in range(n):
        kind = f"{kinds[i % len(kinds)]}{'' if i < len(kinds) else i}"
        props: dict[str, Any] = {
            f"{kind}_title": {"type": "string", "maxLength": 16 + i},
            f"{kind}_rating": {"type": "integer", "minimum": 0, "maximum": 10 + i},
            f"{kind}_known": {"type": "boolean"},
        }
        if i % 2:
            props[f"{kind}_tag"] = {"enum": ["a", "b", f"c{i}"]}
        out.append({"type": "object", "properties": props, "required": list(props), "additionalProperties": False})
    return out


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def conversation(i: int, tag: str) -> list[dict]:
    """Conversation ``i``: one question; ``tag`` opens the system message (a fresh prefix per round)."""
    _, name = SUBJECTS[i % len(SUBJECTS)]
    suffix = "" if i < len(SUBJECTS) else f" (question {i + 1})"
    return [
        {"role": "system", "content": f"[{tag}] {SYSTEM}"},
        {"role": "user", "content": QUESTION.format(name=name) + suffix},
    ]


async def _post(client, path: str, body: dict, errors: Tally) -> dict | None:
    """The JSON body of a 200 response; None (an error counted) otherwise."""
    try:
        response = await client.post(path, json=body)
    except Exception as exc:  # counted, the run goes on
        errors.add(f"{path}: {type(exc).__name__}: {exc}")
        return None
    if response.status_code != 200:
        errors.add(f"{path}: HTTP {response.status_code}: {response.text}")
        return None
    return response.json()


async def _chat(client, messages: list[dict], errors: Tally, **fields) -> Reply | None:
    data = await _post(client, "/v1/chat/completions", {"messages": messages, "temperature": 0.0, **fields}, errors)
    if data is None:
        return None
    choice = data["choices"][0]
    return Reply(choice["message"]["content"] or "", choice["finish_reason"], data["usage"]["completion_tokens"])


async def _phase(client, tag: str, max_tokens: list[int], errors: Tally, fmt: dict | None):
    """One conversation per entry of ``max_tokens`` (its reply's cap), all at once; (wall seconds, each one's reply
    or None)."""
    extra = {"response_format": fmt} if fmt is not None else {}
    start = time.perf_counter()
    replies = await asyncio.gather(
        *(_chat(client, conversation(i, tag), errors, max_tokens=cap, **extra) for i, cap in enumerate(max_tokens))
    )
    return time.perf_counter() - start, replies


def _valid(content: str, validator) -> bool:
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return validator.is_valid(value)


def _loglikelihood_prompts(runtime, n: int, length: int) -> list[list[int]]:
    """``n`` distinct prompts of ``length`` token ids (lm-eval sends context + continuation as ids)."""
    out = []
    for i in range(n):
        text = LOGLIKELIHOOD_TEXT.format(i=i + 1, h=6 + i % 12, k=40 + 7 * i, s=60 + 3 * i)
        ids = runtime.encode(text)
        while len(ids) < length:
            ids = ids + runtime.encode(" " + text)
        out.append(ids[:length])
    return out


async def _loglikelihood(client, prompts: list[list[int]], concurrency: int, errors: Tally) -> tuple[float, int]:
    """(requests per second of ``prompts``, ``concurrency`` in flight at once; replies whose ``token_logprobs`` are
    not one per prompt token and one for the reply's token, the first null: what lm-eval's slice
    ``[ctxlen:-1]`` assumes)."""
    gate = asyncio.Semaphore(concurrency)
    malformed = 0

    async def one(ids: list[int]) -> None:
        nonlocal malformed
        body = {"prompt": ids, "echo": True, "max_tokens": 1, "logprobs": 1, "temperature": 0.0}
        async with gate:
            data = await _post(client, "/v1/completions", body, errors)
        if data is None:
            return
        logprobs = data["choices"][0]["logprobs"] or {}
        scored = logprobs.get("token_logprobs") or []
        if len(scored) != len(ids) + 1 or scored[0] is not None or any(v is None for v in scored[1:]):
            malformed += 1

    start = time.perf_counter()
    await asyncio.gather(*(one(ids) for ids in prompts))
    return len(prompts) / (time.perf_counter() - start), malformed


async def _logprob_reply(client, errors: Tally) -> dict | None:
    body = {
        "messages": LOGPROB_CONVERSATION,
        "logprobs": True,
        "top_logprobs": 5,
        "temperature": 0.0,
        "max_tokens": 16,
    }
    return await _post(client, "/v1/chat/completions", body, errors)


def logprob_difference(cached: dict, uncached: dict) -> tuple[float, bool, int]:
    """(largest absolute difference of any token's log-probability or top alternative's, whether the two replies
    chose the same tokens with the same alternatives, tokens compared) of two chat completions with logprobs."""
    a = cached["choices"][0]["logprobs"]["content"]
    b = uncached["choices"][0]["logprobs"]["content"]
    same = len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b, strict=False):
        if (x["token"], x["bytes"]) != (y["token"], y["bytes"]):
            same = False
            continue
        worst = max(worst, abs(x["logprob"] - y["logprob"]))
        top_x = {(t["token"], tuple(t["bytes"] or ())): t["logprob"] for t in x["top_logprobs"]}
        top_y = {(t["token"], tuple(t["bytes"] or ())): t["logprob"] for t in y["top_logprobs"]}
        if top_x.keys() != top_y.keys():
            same = False
        for key in top_x.keys() & top_y.keys():
            worst = max(worst, abs(top_x[key] - top_y[key]))
    return worst, same, min(len(a), len(b))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def _on_server(
    url: str,
    engine,
    *,
    conversations: int,
    rounds: int,
    max_tokens: int,
    schemas: int,
    loglikelihood_requests: int,
    loglikelihood_tokens: int,
    loglikelihood_concurrency: int,
    errors: Tally,
) -> tuple[dict, dict | None]:
    """Everything measured on the server with the prefix cache; (figures, the cached logprob reply)."""
    import httpx
    import jsonschema

    from chat.engine.constraints import GrammarSpec, canonical_json

    fmt = response_format(SCHEMA)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        # warm-up: the compiler's token table, this grammar, first calls of both kinds
        await _chat(client, conversation(0, "warm-up"), errors, max_tokens=8, response_format=fmt)
        await _chat(client, conversation(1, "warm-up"), errors, max_tokens=8)

        compiler = engine.grammars()
        specs = [GrammarSpec("json_schema", canonical_json(s), strict=True) for s in compile_schemas(schemas)]
        first, again = [], []
        for spec in specs:
            start = time.perf_counter()
            compiler.compile(spec)
            first.append((time.perf_counter() - start) * 1e3)
        for spec in specs:
            start = time.perf_counter()
            compiler.compile(spec)
            again.append((time.perf_counter() - start) * 1e3)

        validator = jsonschema.Draft202012Validator(SCHEMA)
        rates: dict[str, list[float]] = {"constrained": [], "plain": []}
        tokens: dict[str, list[int]] = {"constrained": [], "plain": []}
        constrained: list[Reply] = []
        for r in range(rounds):
            caps = [max_tokens] * conversations
            for kind in ("constrained", "plain"):
                wall, replies = await _phase(
                    client, f"round {r + 1} {kind}", caps, errors, fmt if kind == "constrained" else None
                )
                came = [reply for reply in replies if reply is not None]
                done = sum(reply.completion_tokens for reply in came)
                rates[kind].append(done / wall)
                tokens[kind].append(done)
                if kind == "constrained":
                    constrained.extend(came)
                    caps = [max(1, reply.completion_tokens) if reply else max_tokens for reply in replies]

        stopped = [reply for reply in constrained if reply.finish_reason == "stop"]
        valid = sum(_valid(reply.content, validator) for reply in stopped)

        prompts = _loglikelihood_prompts(engine.runtime, loglikelihood_requests, loglikelihood_tokens)
        ll_rate, ll_malformed = await _loglikelihood(client, prompts, loglikelihood_concurrency, errors)

        await _logprob_reply(client, errors)  # stores the conversation
        cached = await _logprob_reply(client, errors)

    c_rate, p_rate = _p50(rates["constrained"]), _p50(rates["plain"])
    figures = {
        "constrained_tokens_per_s": c_rate,
        "unconstrained_tokens_per_s": p_rate,
        "constrained_tokens_per_s_ratio": c_rate / p_rate if p_rate else float("nan"),
        "constrained_completion_tokens": statistics.median(tokens["constrained"]),
        "unconstrained_completion_tokens": statistics.median(tokens["plain"]),
        "constrained_replies": len(constrained),
        "json_valid": valid / len(stopped) if stopped else 0.0,
        "json_cut_by_length": sum(reply.finish_reason == "length" for reply in constrained),
        "grammar_schemas": len(specs),
        "grammar_compile_ms": _p50(first),
        "grammar_cached_ms": _p50(again),
        "loglikelihood_requests": len(prompts),
        "loglikelihood_requests_per_s": ll_rate,
        "loglikelihood_malformed": ll_malformed,
        "logprob_cached_tokens": cached["usage"]["prompt_tokens_details"]["cached_tokens"] if cached else 0,
    }
    return figures, cached


async def _uncached_reply(url: str, errors: Tally) -> dict | None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        reply = await _logprob_reply(client, errors)
    if reply is not None and reply["usage"]["prompt_tokens_details"]["cached_tokens"] != 0:
        errors.add("the engine without a prefix cache reported cached tokens")
    return reply


def run(model: str = "smollm2", **params) -> dict:
    """The benchmark on ``model`` (loaded in the first engine's worker); ``params`` as :func:`run_with`'s."""
    from chat.models import load_model

    return run_with(lambda: load_model(model), **params)


def run_with(
    loader,
    *,
    conversations: int = 8,
    rounds: int = 2,
    max_tokens: int = 96,
    schemas: int = 10,
    loglikelihood_requests: int = 32,
    loglikelihood_tokens: int = 60,
    loglikelihood_concurrency: int = 4,
) -> dict:
    """The benchmark on the runtime ``loader()`` returns (called in the first engine's worker)."""
    leave_parallelism_to_engines()  # torch runs in parallel in the engines' workers only
    from cache import PrefixCache
    from chat.engine.engine import Engine
    from chat.server.app import create_app
    from chat.server.runner import BackgroundServer
    from chat.server.settings import ServerSettings

    params = dict(
        conversations=conversations,
        rounds=rounds,
        max_tokens=max_tokens,
        schemas=schemas,
        loglikelihood_requests=loglikelihood_requests,
        loglikelihood_tokens=loglikelihood_tokens,
        loglikelihood_concurrency=loglikelihood_concurrency,
    )
    errors = Tally()
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    start = time.perf_counter()
    cache = PrefixCache(device_budget_bytes=GiB, host_budget_bytes=0)
    engine = Engine.load(loader, cache=cache, threads=engine_threads())
    runtime = engine.runtime
    try:
        with BackgroundServer(create_app(engine, ServerSettings(), model_name=runtime.name)) as server:
            figures, cached = asyncio.run(_on_server(server.url, engine, errors=errors, **params))
    finally:
        engine.close()  # its worker, and its torch pool, end before the second engine starts
    bare = Engine(runtime, cache=None, threads=engine_threads())
    try:
        with BackgroundServer(create_app(bare, ServerSettings(prefix_cache=False), model_name=runtime.name)) as server:
            uncached = asyncio.run(_uncached_reply(server.url, errors))
    finally:
        bare.close()
    if cached is not None and uncached is not None:
        diff, same, compared = logprob_difference(cached, uncached)
    else:
        diff, same, compared = float("nan"), False, 0
    return {
        "model": runtime.name,
        "date": date,
        "cpu": cpu_model(),
        "conversations": conversations,
        "rounds": rounds,
        "max_tokens": max_tokens,
        **figures,
        "logprob_tokens": compared,
        "logprob_max_abs_diff_cache_vs_none": diff,
        "same_tokens": same,
        "errors": errors.count,
        "error_samples": errors.samples,
        "wall_s": time.perf_counter() - start,
    }


TARGETS = {
    "errors": ("==", 0),
    "json_valid": ("==", 1.0),
    "logprob_max_abs_diff_cache_vs_none": ("<=", 1e-4),
    "same_tokens": ("==", True),
    "loglikelihood_malformed": ("==", 0),
}


def main(as_json: bool, model: str = "smollm2", conversations: int = 8) -> int:
    emit(run(model, conversations=conversations), TARGETS, as_json)
    return 0
