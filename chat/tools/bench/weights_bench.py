"""``turncache bench weights``: what each weight format of the linear layers costs in quality and gives in speed.

For each format (float32, bfloat16, int8) the default model is loaded with its linear layers in that format and
measured against float32 on the same texts, in one run:

- ``next_token_agreement``: the share of positions where the format's most likely next token is float32's;
- ``perplexity``: exp(mean negative log-likelihood) of the texts' own next tokens;
- ``decode_tokens_per_s``: one greedy reply decoded alone (no speculation), like the engine does;
- ``prefill_tokens_per_s``: one forward over a whole text;
- ``kv_dtypes``: what each format stores its attention K/V in (its default: float16 for int8 where the native kernels
  run), and ``float16_kv_next_token_agreement`` / ``float16_kv_perplexity``: float32 weights with float16 K/V against
  float32, what the float16 rows cost on their own.

The texts (:data:`TEXTS`) are fixed: plain English paragraphs on everyday subjects, a short dialogue, a recipe and a
code snippet, written for this benchmark.
"""

from __future__ import annotations

import math
import time

import torch

from chat.engine.events import TurnRequest
from chat.engine.sampling import SamplingParams
from chat.engine.turn import Turn, run_to_end
from chat.tools.bench.report import emit

FORMATS = ("float32", "bfloat16", "int8")

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
REPLY_TOKENS = 64


def measure(
    weights: str, reference: list[torch.Tensor] | None, kv_dtype: str | None = None, model: str = "smollm2"
) -> tuple[dict[str, float], list[torch.Tensor]]:
    """Figures of one format (K/V rows in ``kv_dtype``, or the format's default); ``reference`` is float32's per-text
    logits (None when measuring float32 itself)."""
    from chat.models import load_model

    runtime = load_model(model, weights=weights, kv_dtype=kv_dtype)
    all_logits: list[torch.Tensor] = []
    nll, count, agree, prefill_s, prefill_tokens = 0.0, 0, 0, 0.0, 0
    for i, text in enumerate(TEXTS):
        ids = runtime.encode(text)
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
    messages = [{"role": "user", "content": REPLY_PROMPT}]
    turn = Turn(runtime, None, TurnRequest(messages, SamplingParams(max_tokens=REPLY_TOKENS)), draft_tokens=0)
    _, done = run_to_end(turn)
    figures = {
        "next_token_agreement": agree / positions if reference is not None else 1.0,
        "perplexity": math.exp(nll / count),
        "decode_tokens_per_s": done.timings.decode_tokens_per_s,
        "prefill_tokens_per_s": prefill_tokens / prefill_s,
        "kv_dtype": runtime.dtype,
    }
    return figures, all_logits


def run(model: str = "smollm2") -> dict:
    results: dict[str, dict[str, float]] = {}
    reference = None
    for weights in FORMATS:
        figures, logits = measure(weights, reference, model=model)
        if weights == "float32":
            reference = logits
        results[weights] = figures
    out: dict = {"model": model, "formats": list(FORMATS)}
    for key in ("next_token_agreement", "perplexity", "decode_tokens_per_s", "prefill_tokens_per_s"):
        out[key] = [round(results[w][key], 4) for w in FORMATS]
    out["kv_dtypes"] = [results[w]["kv_dtype"] for w in FORMATS]
    half, _ = measure("float32", reference, kv_dtype="float16", model=model)  # what float16 rows alone cost
    out["float16_kv_next_token_agreement"] = round(half["next_token_agreement"], 4)
    out["float16_kv_perplexity"] = round(half["perplexity"], 4)
    out["text_tokens"] = sum(len(t.split()) for t in TEXTS)
    return out


def main(as_json: bool) -> int:
    emit(run(), {}, as_json)
    return 0
