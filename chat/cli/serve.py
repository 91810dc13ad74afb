"""`turncache serve`: the chat server, one process or a Ray Serve cluster (--replicas).

The flags become ``ServerSettings`` (and ``ClusterSettings`` with --replicas): a flag given wins over its TURNCACHE_*
environment variable, a flag not given leaves the setting to the environment or its default. A setting out of range
is refused naming its flag.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from chat.cli.common import model_flags

REPEATED_FLAGS = {  # list settings' flags
    "allowed_origins": "allowed-origin",
    "media_url_hosts": "media-url-host",
    "served_model_aliases": "served-model-alias",
    "volatile_lines": "volatile-line",
    "lora": "lora",
}
CLUSTER_FLAGS = (
    "ingresses",
    "proxy_location",
    "ray_address",
    "router",
    "route_imbalance",
    "replica_cpus",
    "max_replicas_per_node",
)


def run(args: argparse.Namespace) -> int:
    from chat.models.errors import ModelError
    from chat.server.main import serve
    from chat.server.persistence.session_rows import SessionDbError
    from chat.server.tenancy.auth import KeysError

    settings, cluster = server_settings(args), cluster_settings(args)
    try:
        if cluster is not None:
            from chat.cluster.launch import serve_cluster  # the only path that imports Ray

            return serve_cluster(settings, cluster)
        return serve(settings)
    except (ModelError, KeysError, SessionDbError) as exc:
        raise SystemExit(f"turncache: {exc}") from exc


def server_settings(args: argparse.Namespace):
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


def cluster_settings(args: argparse.Namespace):
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The serve subparser. Its flags are added in the order `serve --help` lists them (its usage line follows it)."""
    serve = sub.add_parser(
        "serve",
        help="run the chat server (OpenAI-compatible HTTP, metrics, web UI)",
        description="Settings come from these flags, else from TURNCACHE_* environment variables "
        "(TURNCACHE_HOST, TURNCACHE_PORT, TURNCACHE_MODEL, TURNCACHE_AUTH_TOKEN, ...).",
    )
    serve.add_argument("--host", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (8000)")
    model_flags(serve, defaults=False)
    _lora_flags(serve)
    _engine_flags(serve)
    _slow_client_flags(serve)
    _memory_and_access_flags(serve)
    _media_url_flags(serve)
    _storage_flags(serve)
    _volatile_line_flags(serve)
    _tenant_limit_flags(serve)
    _cluster_flags(serve)
    serve.set_defaults(run=run)


def _lora_flags(serve: argparse.ArgumentParser) -> None:
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


def _engine_flags(serve: argparse.ArgumentParser) -> None:
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


def _slow_client_flags(serve: argparse.ArgumentParser) -> None:
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


def _memory_and_access_flags(serve: argparse.ArgumentParser) -> None:
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


def _media_url_flags(serve: argparse.ArgumentParser) -> None:
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


def _under_home(name: str) -> str:
    """``name`` in $TURNCACHE_HOME (default ~/.cache/turncache)."""
    return str(Path(os.environ.get("TURNCACHE_HOME") or "~/.cache/turncache").expanduser() / name)


def _storage_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--sessions-db",
        default=os.environ.get("TURNCACHE_SESSIONS_DB") or _under_home("sessions.sqlite3"),
        help="SQLite file where conversations persist across restarts, or a postgresql://USER@HOST:PORT/DB URL (a "
        "database several processes share: needed by --ingresses above 1; stored /v1/responses are kept there too) "
        "('' keeps them in memory only; default: $TURNCACHE_HOME/sessions.sqlite3, TURNCACHE_HOME defaulting to "
        "~/.cache/turncache)",
    )
    serve.add_argument(
        "--cache-dir",
        default=os.environ.get("TURNCACHE_CACHE_DIR") or _under_home("prefix-cache"),
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


def _volatile_line_flags(serve: argparse.ArgumentParser) -> None:
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


def _tenant_limit_flags(serve: argparse.ArgumentParser) -> None:
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


def _cluster_flags(serve: argparse.ArgumentParser) -> None:
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
