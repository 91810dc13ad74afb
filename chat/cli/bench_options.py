"""Each benchmark of `turncache bench NAME` as data: its help and its flags, in the order its --help lists them.

``chat/cli/bench.py`` builds the subparsers from ``BENCHMARKS`` and runs a benchmark by calling
``chat.tools.bench.<name>_bench.main`` with one keyword per flag (``Option.keyword``), so a flag added here reaches
the benchmark without more plumbing: add it to the benchmark's ``main`` under the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chat.cli.common import levels, positive_float, positive_int


@dataclass(frozen=True)
class Option:
    """One flag: what argparse is given, and the benchmark main's keyword that receives its value."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    action: str | None = None
    dest: str | None = None  # argparse's, when not the flag's name
    keyword: str | None = None  # the benchmark main's parameter, when not the dest

    @property
    def name(self) -> str:
        """Where argparse keeps the value: ``args.<name>``."""
        return self.dest or self.flag.removeprefix("--").replace("-", "_")

    @property
    def parameter(self) -> str:
        return self.keyword or self.name

    def argparse_kwargs(self) -> dict[str, Any]:
        given = {
            "type": self.type,
            "default": self.default,
            "metavar": self.metavar,
            "action": self.action,
            "dest": self.dest,
        }
        return {"help": self.help} | {key: value for key, value in given.items() if value is not None}


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    options: tuple[Option, ...]
    description: str | None = None

    @property
    def module(self) -> str:
        """The module whose ``main`` runs it, imported only then (the serving path imports no ``chat.tools``)."""
        return f"chat.tools.bench.{self.name}_bench"


JSON = Option("--json", "print one JSON object instead of a table", action="store_true", keyword="as_json")
MODEL = Option(
    "--model",
    "model spec, as for serve --model: a name, a model directory or a GGUF file (default: smollm2)",
    default="smollm2",
)
CHAT_TEMPLATE = Option(
    "--chat-template",
    "a chat template file or text instead of the model's own, as for serve --chat-template (a base model needs one "
    "to chat)",
    metavar="FILE_OR_TEXT",
)
CONVERSATIONS = Option("--conversations", "conversations, all concurrent (8)", type=int, default=8)

BENCHMARKS = (
    Benchmark(
        "cache",
        "the prefix cache alone: lookup latency, restore time, memory",
        (JSON, Option("--entries", "entries in the lookup benchmark (10,000)", type=int)),
    ),
    Benchmark(
        "weights",
        "a model in each weight format (a GGUF file's own blocks too) against its float32 dequantization: "
        "next-token agreement, perplexity ratio, decode and 8-session speed",
        (JSON, MODEL, Option("--rounds", "interleaved speed rounds, best kept (%(default)s)", type=int, default=3)),
    ),
    Benchmark(
        "turns",
        "a 10-turn chat on one model: time to first token with and without the cache, decode speed "
        "(on a multimodal model, e.g. tiny-omni, every message carries media and encoder_skipped is added)",
        (JSON, MODEL),
    ),
    Benchmark("serve", "8 concurrent WebSocket sessions x 5 turns on a loopback server", (JSON, MODEL, CHAT_TEMPLATE)),
    Benchmark(
        "load",
        "32 concurrent WebSocket sessions x 5 turns: throughput, latency, resident memory",
        (JSON, MODEL, CHAT_TEMPLATE),
    ),
    Benchmark(
        "batch",
        "aggregate decode throughput at 1-32 concurrent sessions, single stream with and without speculation, "
        "and transformers generate on the same prompts",
        (JSON, MODEL),
    ),
    Benchmark(
        "multiturn",
        "SGLang-shaped multi-turn chat: concurrent conversations x 4 turns of 256-512-token user messages, "
        "with and without the prefix cache",
        (JSON, MODEL, Option("--conversations", "conversations, all concurrent (8)", type=int), CHAT_TEMPLATE),
    ),
    Benchmark(
        "agent",
        "agent loops over HTTP with the openai client: tool calls (chat completions and /v1/responses) and a "
        "thinking model; validity of calls and what the cache serves of each step",
        (JSON, MODEL),
    ),
    Benchmark(
        "constrained",
        "JSON-schema constrained vs plain chat completions over HTTP (tokens/s, validity), grammar compile "
        "time, loglikelihood requests/s, logprobs with and without the prefix cache",
        (JSON, MODEL, CONVERSATIONS),
    ),
    Benchmark(
        "http",
        "bench batch's workload in the engine and through a loopback server (HTTP streaming and WebSocket): "
        "what serving keeps of the engine's throughput",
        (
            JSON,
            MODEL,
            CHAT_TEMPLATE,
            Option("--levels", "concurrent sessions (1,8,32)", type=levels, default=(1, 8, 32), metavar="N,N,..."),
            Option(
                "--rounds",
                "runs of each level and way, the ways back to back in each round (order reversed every other "
                "round); medians, served/engine paired by round (8: one round's ratio moves +-15%% on 2 vCPUs)",
                type=positive_int,
                default=8,
            ),
            Option(
                "--bad-level",
                "sessions of the bad-client phase, run without and with slow readers, silent connections and a "
                "flood of tiny requests beside them (default: the largest level)",
                type=positive_int,
                metavar="N",
            ),
            Option(
                "--bad-pause-s",
                "seconds a slow reader of the bad-client phase reads nothing after its request (5)",
                type=positive_float,
                default=5.0,
                metavar="S",
            ),
            Option(
                "--clients-in-process",
                "run the sessions' clients in the benchmark's own process (sharing its interpreter lock with the "
                "server and the engine) instead of a process of their own",
                action="store_false",
                dest="clients_in_own_process",
                keyword="clients_apart",
            ),
        ),
    ),
    Benchmark(
        "lora",
        "8 multi-turn chat sessions spread over 4 LoRA adapters (made with peft for the model's config) and the "
        "base in one engine, against the same sessions on the base alone: tokens/s ratio, cached ratio per adapter, "
        "cross-adapter cache hits",
        (
            JSON,
            MODEL,
            Option("--sessions", "concurrent sessions (8)", type=positive_int),
            Option("--rounds", "rounds of both phases, alternating (2)", type=positive_int),
        ),
    ),
    Benchmark(
        "chat",
        "N conversations x 4 turns (~40-word messages, 64-token greedy replies) with the server's default "
        "settings: the engine alone, stateless HTTP with the whole history, WebSocket sessions; the disk tier's cost",
        (
            JSON,
            MODEL,
            Option("--levels", "concurrent conversations (1,8,32)", type=levels, default=(1, 8, 32), metavar="N,N,..."),
            Option(
                "--rounds",
                "runs of each level and way, the ways back to back in each round (order reversed every other "
                "round); medians, ratios paired by round (%(default)s)",
                type=positive_int,
                default=2,
            ),
            Option("--turns", "turns per conversation (%(default)s)", type=positive_int, default=4),
        ),
    ),
    Benchmark(
        "restart",
        "a conversation resumed after a server restart: cached tokens and time to first token with the disk "
        "tier, without a restart, and with the disk tier off (three server processes)",
        (JSON, MODEL, Option("--turns", "turns before the restart (%(default)s)", type=int, default=10)),
    ),
    Benchmark(
        "cluster",
        "the multiturn workload (stateless) on a Ray Serve cluster: prefix-affine vs round-robin routing",
        (JSON, MODEL, CONVERSATIONS, Option("--replicas", "engine replicas (2)", type=int, default=2, metavar="N")),
    ),
    Benchmark(
        "tenants",
        "a quiet tenant's 2 streaming chat sessions x 10 turns over HTTP, alone and while a noisy tenant runs 32 "
        "concurrent eval conversations over its concurrent-turns limit (429s, Retry-After honoured), on a cache "
        "those conversations fill 4 times over, with tenant shares on: the quiet tenant's first-token p50 ratio and "
        "cached ratio",
        (
            JSON,
            MODEL,
            Option("--turns", "turns of each quiet session (10)", type=int, metavar="N", keyword="quiet_turns"),
            Option(
                "--conversations",
                "the noisy tenant's concurrent conversations (32)",
                type=int,
                metavar="N",
                keyword="noisy_conversations",
            ),
            Option(
                "--quiet-priority",
                "the quiet tenant's default priority in the keys file, -100..100, lower: sooner (-10); not 0: a "
                "third phase runs it under the same load without",
                type=int,
                metavar="P",
            ),
            Option(
                "--token-budget",
                "the server's most tokens in one batched forward, as serve --token-budget (256)",
                type=int,
                metavar="N",
            ),
            Option(
                "--yield-budget",
                "the server's tokens per step for worse priorities while a better one is around, as serve "
                "--yield-budget (16; 0: off)",
                type=int,
                metavar="N",
            ),
            Option(
                "--yield-hold-s",
                "seconds a priority stays around after its last turn, as serve --yield-hold-s (10)",
                type=float,
                metavar="S",
            ),
            Option(
                "--threads",
                "torch threads of the server's engine, as serve --threads (the number of CPU cores)",
                type=int,
                metavar="N",
            ),
        ),
        description="One loopback server, HTTP, a keys file of two tenants, tenant cache shares on, a device cache "
        "budget the noisy tenant's conversations fill 4 times over. Phases: the quiet tenant alone; under the noisy "
        "load with its keys-file priority; under the same load without (unless --quiet-priority 0). Keys: "
        "quiet_ttft_p50_ratio (target <= 1.5), quiet_cached_ratio (>= 0.9), noisy_tokens_per_s, rate_limited, "
        "errors (0); chat/tools/bench/tenants_bench.py and docs/benchmarks.md say more. Progress goes to stderr.",
    ),
)
BY_NAME = {benchmark.name: benchmark for benchmark in BENCHMARKS}
