"""`turncache bench turns`: a 10-turn chat on one model, every figure from this one run, side by side.

The chat grows to about 2,000 tokens with ~64-token user messages and greedy replies of up to 128 tokens. Figures:

- ``ttft_hit_ms``: turn 10 through the whole pipeline (render, lookup, restore, prefill the suffix, first token) with
  the prefix cache warm from turns 1-9;
- ``ttft_miss_ms``: the same turn with ``--no-prefix-cache`` (the whole prompt is prefilled);
- ``ttft_floor_ms``: only the forward of that turn's suffix, on a state restored beforehand (the least any cache
  could cost), plus sampling the first token;
- ``hf_reprefill_ms``: HF ``generate`` on the whole turn-10 prompt with one new token (what a user without a prefix
  cache would do);
- ``hit_speedup`` = miss / hit, ``overhead_ratio`` = hit / floor;
- ``decode_tps`` and ``hf_decode_tps``: tokens per second after the first, ours (in the model's default weight
  format, e.g. gguf-q16 for the built-in model) vs HF ``generate`` on the float32 weights as loaded from disk, same
  prompt, same number of new tokens (greedy; EOS ignored by neither, so both stop at the same place); ``weights``
  names the engine's format.

On a multimodal model (``--model tiny-omni``, ``tiny-llava`` or a multimodal directory) every user message also
carries media (:data:`MEDIA_PLAN`: new images, audio clips and videos, and repeats of earlier ones, as far as the
model takes each kind); HF ``generate`` gets the same media. One more figure:

- ``encoder_skipped``: over turns 2-10, the media items of the prompt that had been sent before (in the history, or
  repeated in a new message) and were not encoded again, divided by the number of such items (1.0 = never
  re-encoded).

On a model that takes images, a second session of 20 turns with one new photo each goes through the WebSocket's
path (:mod:`chat.tools.bench.media_session`): ``request_ms_per_turn``, ``render_ms_per_turn`` and ``ttft_ms_per_turn``,
one figure per turn.

What the model's media store holds at the end of the run (both sessions' items, as
:meth:`chat.models.hf.multimodal.MultimodalAdapter.held_media` reports them), averaged over the items held:

- ``media_bytes_per_item``: bytes of one image's encoder output as stored, measured from its tensors (elements times
  element size): the rows written over its span (on SmolVLM the whole span: tile markers, breaks and image rows) plus,
  on Qwen3-VL, its deepstack rows (one set per deepstack layer); the mean over the image items held;
- ``media_bytes_per_kind``: the same mean for each kind held ("image", "audio", "video");
- ``media_prepared_bytes_per_item``: bytes of one image's encoder inputs (e.g. pixel patches), which the store keeps
  as well so that a repeat is not decoded again; the mean over the same image items;
- ``media_items_held``: how many items' encoder outputs the store holds.
"""

from __future__ import annotations

import random
import statistics
import time

from cache import Namespace, PrefixCache
from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams, sample
from chat.engine.turn import Turn, run_to_end
from chat.tools.bench.report import emit

USER_TOPICS = [
    "the history of the printing press",
    "how bridges carry load",
    "why the sky is blue",
    "how vaccines work",
    "the rules of chess",
    "how a compiler works",
    "what causes tides",
    "how bees make honey",
    "how batteries store energy",
    "why cats purr",
]
FILLER = (
    "Please answer in detail, with examples, and explain each step carefully so that a curious student "
    "who has never read about it before can follow along easily."
)


# media of each turn's user message: (kind, seed); a (kind, seed) seen before is the same bytes again
MEDIA_PLAN: tuple[tuple[tuple[str, int], ...], ...] = (
    (("image", 1),),
    (("audio", 1),),
    (("image", 2),),
    (("video", 1),),
    (("image", 1),),
    (("image", 3), ("audio", 1)),
    (("video", 1),),
    (("image", 4),),
    (("image", 2),),
    (("image", 1), ("image", 5)),
)


def user_content(rng: random.Random, turn: int, runtime) -> str | list:
    """The user message of ``turn``: text, plus media on models that take them."""
    text = user_message(rng, turn)
    kinds = runtime.modalities
    if not kinds:
        return text
    from chat.tools.bench import media_samples
    from modalities.parts import MediaInput

    make = {"image": media_samples.picture, "audio": media_samples.tone_wav, "video": media_samples.moving_box_mp4}
    parts: list = [{"type": "text", "text": text}]
    for kind, seed in MEDIA_PLAN[turn % len(MEDIA_PLAN)]:
        if kind in kinds:
            parts.append(MediaInput.from_bytes(kind, make[kind](seed), None, f"turn {turn + 1} {kind} {seed}"))
    return parts


def _render(runtime, messages: list[dict]):
    """(tokens, media spans, rendered prompt)."""
    rendered = runtime.render_prompt(messages)
    return list(rendered.tokens), tuple(rendered.spans), rendered


def user_message(rng: random.Random, turn: int) -> str:
    """About 64 tokens."""
    topic = USER_TOPICS[turn % len(USER_TOPICS)]
    return f"Question {turn + 1}: tell me about {topic}. {FILLER} Also mention one surprising fact."


class _NoStore:
    """The cache, read-only: lookups and leases go through, inserts are dropped."""

    def __init__(self, cache: PrefixCache) -> None:
        self._cache = cache

    def lookup(self, *args, **kwargs):
        return self._cache.lookup(*args, **kwargs)

    def acquire(self, *args, **kwargs):
        return self._cache.acquire(*args, **kwargs)

    def release(self, lease) -> None:
        self._cache.release(lease)

    def insert(self, *args, **kwargs) -> None:
        return None


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _decode_rates(
    runtime, model: str, messages: list[dict], prompt: list[int], decode_tokens: int, repeats: int
) -> tuple[list[float], list[float], list[float]]:
    """Per repeat: stock transformers' prefill time (ms) and decode rate on the same prompt, and ours (tokens/s)."""
    from chat.tools.testing.baselines import hf_generate, hf_generate_media, load_stock, load_stock_media

    hf_prefill: list[float] = []
    hf_decode: list[float] = []
    ours_decode: list[float] = []

    # the baseline is stock transformers on the float32 weights as loaded from disk (a model of its own), on the same
    # prompt
    if runtime.modalities:
        media = load_stock_media(model)
    else:
        stock = load_stock(model)

    def baseline(n: int) -> list[int]:
        if runtime.modalities:
            return hf_generate_media(media, runtime, runtime.render_prompt(messages), n)
        return hf_generate(stock, prompt, n)

    for _ in range(repeats):
        t = time.perf_counter()
        baseline(1)
        hf_prefill.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        produced = baseline(decode_tokens)
        total = (time.perf_counter() - t) * 1e3
        hf_decode.append((len(produced) - 1) / ((total - hf_prefill[-1]) / 1e3))
        budget = SamplingParams(max_tokens=len(produced))
        _, done = run_to_end(Turn(runtime, None, TurnRequest(messages, budget)))
        ours_decode.append(done.timings.decode_tokens_per_s)
    return hf_prefill, hf_decode, ours_decode


def run(
    model: str = "smollm2",
    *,
    turns: int = 10,
    reply_tokens: int = 128,
    decode_tokens: int = 64,
    repeats: int = 3,
    weights: str | None = None,
    session_turns: int = 20,
) -> dict[str, float]:
    from chat.models import load_model

    runtime = load_model(model, weights=weights)
    cache = PrefixCache()
    rng = random.Random(0)
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
    params = SamplingParams(max_tokens=reply_tokens)
    counters = runtime.media_counters if runtime.modalities else None
    seen: set[str] = set()  # content hashes of the media sent so far
    repeated = skipped = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": user_content(rng, turn, runtime)})
        if turn == turns - 1:
            break
        encoded_before = counters["encoded"] if counters is not None else 0
        _, done = run_to_end(Turn(runtime, cache, TurnRequest(list(messages), params)))
        if done.error is not None:
            raise done.error
        messages.append({"role": "assistant", "content": done.text})
        if counters is not None:
            spans = _render(runtime, messages[:-1])[1]
            again = [s for s in spans if s.content_hash in seen]
            fresh = {s.content_hash for s in spans} - seen
            if turn > 0:
                repeated += len(again)
                skipped += len(again) - (counters["encoded"] - encoded_before - len(fresh))
            seen.update(s.content_hash for s in spans)
    prompt, spans, rendered = _render(runtime, messages)
    namespace = Namespace(runtime.fingerprint, runtime.dtype)
    if counters is not None:  # the last turn runs below on a frozen cache: count it before anything runs
        match = cache.lookup(namespace, prompt, spans)
        prefix = match.length if match is not None else 0
        again = [s for s in spans if s.content_hash in seen]
        repeated += len(again)
        skipped += sum(1 for s in again if s.end <= prefix or _stored(runtime, s))
    first_token = SamplingParams(max_tokens=1)

    frozen = _NoStore(cache)  # every repeat sees the cache exactly as turn 9 left it
    hits, misses, floors, cached = [], [], [], 0
    for _ in range(repeats):
        _, done = run_to_end(Turn(runtime, frozen, TurnRequest(messages, first_token)))
        hits.append(done.timings.ttft_ms)
        cached = done.usage.cached_tokens
        _, done = run_to_end(Turn(runtime, None, TurnRequest(messages, first_token)))
        misses.append(done.timings.ttft_ms)
        # the floor: restore outside the clock; time only the suffix forward and the first sample
        match = cache.lookup(namespace, prompt, spans)
        lease = cache.acquire(match, namespace)
        state = runtime.new_run(lease, rendered)
        t = time.perf_counter()
        logits = runtime.forward(state, prompt[match.length :], last_only=True)
        sample(logits[-1], first_token, None)
        floors.append((time.perf_counter() - t) * 1e3)
        runtime.close_run(state)
        cache.release(lease)

    hf_prefill, hf_decode, ours_decode = _decode_rates(runtime, model, messages, prompt, decode_tokens, repeats)

    hit, miss, floor = _median(hits), _median(misses), _median(floors)
    media = {}
    if counters is not None:
        media = {
            "media_items": len(spans),
            "media_repeated": repeated,
            "encoder_skipped": skipped / repeated if repeated else 0.0,
        }
    if "image" in runtime.modalities:
        from chat.tools.bench import media_session

        media.update(media_session.run(runtime, session_turns))
    if counters is not None:
        media.update(held_media_sizes(runtime))
    return {
        "model": runtime.name,
        "turn10_prompt_tokens": len(prompt),
        "turn10_cached_tokens": cached,
        "ttft_hit_ms": hit,
        "ttft_miss_ms": miss,
        "ttft_floor_ms": floor,
        "hf_reprefill_ms": _median(hf_prefill),
        "hit_speedup": miss / hit,
        "overhead_ratio": hit / floor,
        "decode_tps": _median(ours_decode),
        "hf_decode_tps": _median(hf_decode),
        "decode_ratio": _median(ours_decode) / _median(hf_decode),
        "weights": runtime.weights,
        **media,
    }


def held_media_sizes(runtime) -> dict[str, object]:
    """The ``media_*`` figures on what ``runtime``'s media store holds now (see the module docstring)."""
    held = runtime.held_media()
    by_kind: dict[str, list[int]] = {}
    for item in held:
        by_kind.setdefault(item.kind, []).append(item.encoded_bytes)
    images = [item for item in held if item.kind == "image"]
    out: dict[str, object] = {
        "media_items_held": len(held),
        "media_bytes_per_kind": {kind: statistics.fmean(sizes) for kind, sizes in sorted(by_kind.items())},
    }
    if images:
        out["media_bytes_per_item"] = statistics.fmean(item.encoded_bytes for item in images)
        out["media_prepared_bytes_per_item"] = statistics.fmean(item.prepared_bytes for item in images)
    return out


def _stored(runtime, span) -> bool:
    """Whether the encoder output of ``span`` is in the runtime's media store (so it is not encoded again)."""
    return runtime.media_store.contains(span.content_hash, f"encoded:{runtime.fingerprint}")


TARGETS = {"hit_speedup": (">=", 10.0), "overhead_ratio": ("<=", 1.10), "decode_ratio": (">=", 1.5)}


def main(as_json: bool, model: str = "smollm2") -> int:
    emit(run(model), TARGETS, as_json)
    return 0
