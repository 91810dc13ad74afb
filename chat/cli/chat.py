"""`turncache chat`: chat in the terminal on the engine, without a server."""

from __future__ import annotations

import argparse
import os

from chat.cli.common import model_flags


def add_parser(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser("chat", help="chat in the terminal on the engine, without a server")
    model_flags(chat, defaults=True)
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--system", help="system prompt")
    chat.add_argument(
        "--tools",
        metavar="FILE",
        help='functions the model may call: a JSON list of OpenAI tool definitions ({"type": "function", '
        '"function": {"name", "description", "parameters"}}); the terminal asks for each call\'s result',
    )
    chat.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
    tools = tools_file(args.tools) if args.tools else None
    runtime = load(args)
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


def load(args: argparse.Namespace):
    """The model of the flags, its chat template from --chat-template or TURNCACHE_CHAT_TEMPLATE if given."""
    from chat.models import load_model
    from chat.models.errors import ModelError

    template = args.chat_template or os.environ.get("TURNCACHE_CHAT_TEMPLATE") or None
    try:
        return load_model(args.model, args.dtype, args.weights, args.kv_dtype, chat_template=template)
    except ModelError as exc:
        raise SystemExit(f"turncache: {exc}") from exc


def tools_file(path: str) -> list:
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
