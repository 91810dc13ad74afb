"""``turncache bench weights``: what each weight format of the linear layers costs in quality and gives in speed.

The model (the built-in ``smollm2``, or ``--model PATH.gguf``) is loaded in every format at once, and each is measured
against the file's own float32 dequantization on the same texts, side by side in one run: float32, bfloat16, int8
(per-channel re-quantization of the dequantized weights), and for a GGUF file its own blocks, ``gguf`` (weight-only:
float32 activations times the exact weights), ``gguf-q16`` and ``gguf-q8`` (activations rounded to int16 / int8 per
32 values, VNNI dot products; :mod:`chat.models.kernels.block_matrices`). Per format, in lists in the order of
``formats``:

- ``next_token_agreement``: the share of positions where the format's most likely next token is float32's;
- ``perplexity``: exp(mean negative log-likelihood) of the texts' own next tokens; ``perplexity_ratio``: over
  float32's;
- ``decode_tokens_per_s``: one greedy reply decoded alone (no speculation), like the engine does;
- ``batch8_tokens_per_s``: 8 sessions decoding together: greedy steps of 8 runs in one ``forward_batch`` after
  their prompts (all tokens of the timed steps over their wall time);
  both speeds are the best of ``rounds`` rounds in which every format runs in turn (all formats are loaded at once);
- ``prefill_tokens_per_s``: one forward over a whole text;
- ``kv_dtypes``: what each format stores its attention K/V in (its default), and ``float16_kv_next_token_agreement``
  / ``float16_kv_perplexity``: float32 weights with float16 K/V against float32, what the float16 rows cost alone;
- ``meets_default_rule``: whether the format's answers meet the rule a default must meet (issue 35: next-token
  agreement >= 0.99 and perplexity ratio <= 1.005); ``default_rule_format``: the fastest of those in this run
  (highest ``batch8_tokens_per_s``); ``default_format``: the model's default as the code fixes it
  (:data:`chat.models.specs.GGUF_DEFAULT_WEIGHTS`; a benchmark never runs at start), which should be that one;
- ``float32_fallback_layers``: linear layers the ``gguf`` format computes from float32 weights (a tensor type
  without a block kernel, a float32 tensor; :func:`chat.models.kernels.block_matrices.float32_layers`), None for a model
  that is no GGUF file;
- ``rss_idle_mib`` / ``rss_loaded_mib``: resident memory of a fresh process (one per format, started for this)
  after loading the model in that format, then with 8 sessions open after their prompts and a few decode steps.

Speeds depend on the machine and its load: compare formats within one run only. The texts (:data:`TEXTS`) are fixed:
plain English paragraphs on everyday subjects, a short dialogue, a recipe and a code snippet, written for this
benchmark.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from chat.models.kernels import block_matrices
from chat.tools.bench.report import emit

FORMATS = ("float32", "bfloat16", "int8")  # every model
BLOCK_FORMATS = ("gguf", "gguf-q16", "gguf-q8")  # a GGUF file's
RULE = {"next_token_agreement": 0.99, "perplexity_ratio": 1.005}  # a default's quality; the fastest of those wins
BATCH = 8  # sessions of batch8_tokens_per_s
BATCH_STEPS = 24  # timed decode steps of the batch

TEXTS = (
    "The river behind the old mill freezes only in the coldest winters. When it does, the children of the village "
    "walk across it to the far bank, where an orchard of apple trees grows wild. Their grandparents remember a year "
    "when the ice held for six weeks and a fair was held on it, with stalls selling roasted chestnuts and hot cider.",
    "To repot a houseplant, water it a day before so the roots slide out easily. Choose a pot one size larger, with "
    "a drainage hole. Put a layer of fresh soil at the bottom, set the plant at the same depth as before, fill the "
    "sides, press gently, and water until it runs out below. Keep it out of direct sun for a week.",
    "Alice: Did you see the message from the landlord about the heating?\nBob: Yes, they want to check the boiler on "
    "Thursday morning. I told them someone would be home.\nAlice: I have a meeting at nine. Can you stay until "
    "they arrive?\nBob: Sure, I can work from the kitchen table that day.",
    "Bread needs only flour, water, salt and yeast. Mix five hundred grams of flour with three hundred and fifty "
    "grams of warm water, let it rest for half an hour, then add ten grams of salt and a little yeast. Fold the "
    "dough every thirty minutes for two hours, shape it, and bake it in a very hot oven for forty minutes.",
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)"
    "\n\n\ndef variance(values):\n    m = mean(values)\n    return sum((v - m) ** 2 for v in values) / len(values)\n",
    "Trains between the two cities run every hour during the day and every two hours at night. The journey takes a "
    "little under three hours, and tickets bought a week in advance cost about half the price of those bought at "
    "the station. Bicycles travel free in the last carriage if there is room.",
    "A good night's sleep depends more on habits than on the mattress. Going to bed at the same time every night, "
    "keeping the bedroom cool and dark, and putting the phone away an hour before sleeping help most people fall "
    "asleep faster. Coffee late in the afternoon is a common reason for lying awake.",
    "The museum's new exhibition shows tools used by farmers over the last two centuries: wooden ploughs, iron "
    "sickles, the first machines that separated grain from straw, and a tractor that still starts on cold mornings. "
    "Visitors can try a hand mill and grind a cup of wheat into flour.",
)
REPLY_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
REPLY_TOKENS = 48
ROUNDS = 3  # interleaved speed rounds; the best of each format's counts


def quality(runtime, reference: list[torch.Tensor] | None) -> tuple[dict[str, float], list[torch.Tensor]]:
    """Quality figures and prefill speed of one loaded format; ``reference`` is float32's per-text logits (None when
    measuring float32 itself)."""
    all_logits: list[torch.Tensor] = []
    nll, count, agree, prefill_s, prefill_tokens = 0.0, 0, 0, 0.0, 0
    encode = getattr(runtime, "encode_prompt", None) or runtime.encode  # a model's own BOS, as completions get it
    for i, text in enumerate(TEXTS):
        ids = encode(text)
        run = runtime.new_run()
        start = time.perf_counter()
        logits = runtime.forward(run, ids)  # [n, vocab]
        prefill_s += time.perf_counter() - start
        prefill_tokens += len(ids)
        runtime.close_run(run)
        all_logits.append(logits)
        logp = torch.log_softmax(logits[:-1].double(), dim=-1)
        targets = torch.tensor(ids[1:])
        nll -= float(logp.gather(1, targets.unsqueeze(1)).sum())
        count += len(ids) - 1
        if reference is not None:
            agree += int((logits.argmax(-1) == reference[i].argmax(-1)).sum())
    positions = sum(len(x) for x in all_logits)
    figures = {
        "next_token_agreement": agree / positions if reference is not None else 1.0,
        "perplexity": math.exp(nll / count),
        "prefill_tokens_per_s": prefill_tokens / prefill_s,
        "kv_dtype": runtime.dtype,
    }
    return figures, all_logits


def decode_speed(runtime) -> float:
    """Tokens per second of one greedy reply decoded alone (no speculation), as the engine decodes it (a chat turn;
    a base model's prompt goes in as a completion's)."""
    params = SamplingParams(max_tokens=REPLY_TOKENS)
    if getattr(runtime, "chats", True):
        request = TurnRequest([{"role": "user", "content": REPLY_PROMPT}], params)
    else:  # a base model (no chat template): the prompt as a completion's
        request = TurnRequest((), params, prompt_tokens=runtime.encode_prompt(REPLY_PROMPT))
    turn = Turn(runtime, None, request, draft_tokens=0)
    _, done = run_to_end(turn)
    return done.timings.decode_tokens_per_s


def batch_speed(runtime, sessions: int = BATCH, steps: int = BATCH_STEPS) -> float:
    """Tokens per second of ``sessions`` runs decoding greedily together, one ``forward_batch`` per step, after
    their prompts (each session a different text's first 32 tokens)."""
    from chat.engine.runtime import Feed

    runs, tokens = [], []
    for i in range(sessions):
        run = runtime.new_run()
        prompt = runtime.encode(TEXTS[i % len(TEXTS)])[:32]
        tokens.append(int(runtime.forward(run, prompt, last_only=True)[-1].argmax()))
        runs.append(run)
    start = time.perf_counter()
    for _ in range(steps):
        outs = runtime.forward_batch([Feed(run, [token], 1) for run, token in zip(runs, tokens, strict=True)])
        tokens = [int(out[-1].argmax()) for out in outs]
    seconds = time.perf_counter() - start
    for run in runs:
        runtime.close_run(run)
    return sessions * steps / seconds


def formats_of(model: str) -> tuple[str, ...]:
    """The formats measured for ``model``: the block formats too for a GGUF file."""
    from chat.models.specs import is_gguf_spec

    return FORMATS + BLOCK_FORMATS if is_gguf_spec(model) else FORMATS


def meets_rule(figures: dict[str, float]) -> bool:
    """Whether a format's answers may be the default's: next-token agreement and perplexity ratio within
    :data:`RULE`."""
    return (
        figures["next_token_agreement"] >= RULE["next_token_agreement"]
        and figures["perplexity_ratio"] <= RULE["perplexity_ratio"]
    )


def rule_choice(results: dict[str, dict[str, float]]) -> str | None:
    """The format the default rule picks: the fastest at 8 sessions of those that meet :func:`meets_rule` (None if
    none does)."""
    able = [w for w, figures in results.items() if meets_rule(figures)]
    return max(able, key=lambda w: results[w]["batch8_tokens_per_s"], default=None)


MEMORY_STEPS = 4  # decode steps of the 8 sessions before rss_loaded_mib is read


def memory(model: str, weights: str) -> dict[str, float]:
    """``{"rss_idle_mib", "rss_loaded_mib"}`` of ``model`` in ``weights``, measured in a fresh Python process (so
    that no other format's memory, nor what this process freed, is counted)."""
    code = f"from chat.tools.bench.weights_bench import memory_child; memory_child({model!r}, {weights!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the memory run of {weights} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory_child(model: str, weights: str) -> None:
    """In a fresh process: load, read the resident set; open 8 sessions, prefill and decode a few steps, read it
    again; print both as one JSON line."""
    from chat.engine.runtime import Feed
    from chat.models import load_model
    from chat.models.memory import resident_mib

    runtime = load_model(model, weights=weights)
    idle = resident_mib()
    runs, tokens = [], []
    for i in range(BATCH):
        run = runtime.new_run()
        prompt = runtime.encode(TEXTS[i % len(TEXTS)])
        tokens.append(int(runtime.forward(run, prompt, last_only=True)[-1].argmax()))
        runs.append(run)
    for _ in range(MEMORY_STEPS):
        outs = runtime.forward_batch([Feed(run, [token], 1) for run, token in zip(runs, tokens, strict=True)])
        tokens = [int(out[-1].argmax()) for out in outs]
    print(json.dumps({"rss_idle_mib": round(idle, 1), "rss_loaded_mib": round(resident_mib(), 1)}), flush=True)


def run(model: str = "smollm2", rounds: int = ROUNDS) -> dict:
    """Every format loaded side by side; quality first (deterministic), then speeds in ``rounds`` interleaved
    rounds (each format in turn, the best of its rounds kept), so that a change of the machine's load during the run
    falls on every format alike."""
    from chat.models import load_model
    from chat.models.specs import parse_weights

    formats = formats_of(model)
    runtimes = {}
    for weights in formats:
        _progress(f"loading {model} with {weights} weights")
        runtimes[weights] = load_model(model, weights=weights)
    results: dict[str, dict[str, float]] = {}
    reference = None
    for weights in formats:
        results[weights], logits = quality(runtimes[weights], reference)
        if weights == "float32":
            reference = logits
    for weights in formats:
        results[weights]["perplexity_ratio"] = results[weights]["perplexity"] / results["float32"]["perplexity"]
        results[weights]["decode_tokens_per_s"] = results[weights]["batch8_tokens_per_s"] = 0.0
    for turn in range(rounds):
        _progress(f"speed round {turn + 1} of {rounds}")
        for weights in formats:
            figures = results[weights]
            figures["decode_tokens_per_s"] = max(figures["decode_tokens_per_s"], decode_speed(runtimes[weights]))
            figures["batch8_tokens_per_s"] = max(figures["batch8_tokens_per_s"], batch_speed(runtimes[weights]))
    fallback = block_matrices.float32_layers(runtimes["gguf"]._model) if "gguf" in runtimes else None
    runtimes.clear()
    out: dict = {"model": model, "formats": list(formats), "default_format": parse_weights(None, "float32", model)}
    keys = ("next_token_agreement", "perplexity", "perplexity_ratio", "decode_tokens_per_s", "batch8_tokens_per_s")
    for key in (*keys, "prefill_tokens_per_s"):
        out[key] = [round(results[w][key], 4) for w in formats]
    out["kv_dtypes"] = [results[w]["kv_dtype"] for w in formats]
    out["meets_default_rule"] = [meets_rule(results[w]) for w in formats]
    out["default_rule_format"] = rule_choice(results)
    out["float32_fallback_layers"] = fallback
    sizes = {}
    for weights in formats:
        _progress(f"resident memory with {weights} weights (a fresh process)")
        sizes[weights] = memory(model, weights)
    out["rss_idle_mib"] = [sizes[w]["rss_idle_mib"] for w in formats]
    out["rss_loaded_mib"] = [sizes[w]["rss_loaded_mib"] for w in formats]
    half, _ = quality(load_model(model, weights="float32", kv_dtype="float16"), reference)  # float16 rows alone
    out["float16_kv_next_token_agreement"] = round(half["next_token_agreement"], 4)
    out["float16_kv_perplexity"] = round(half["perplexity"], 4)
    out["rounds"] = rounds
    out["text_tokens"] = sum(len(t.split()) for t in TEXTS)
    out["cpu"] = _cpu_model()
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _progress(what: str) -> None:
    print(f"bench weights: {what}", file=sys.stderr, flush=True)


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def main(as_json: bool, model: str = "smollm2", rounds: int = ROUNDS) -> int:
    emit(run(model, rounds), {"perplexity_ratio": ("<=", RULE["perplexity_ratio"])}, as_json)
    return 0
