"""Server settings, from flags and from the environment (``TURNCACHE_*``); flags win."""

from __future__ import annotations

import os

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from chat.engine.volatile_lines import DEFAULT_PATTERNS, VolatileLines
from chat.protocol.limits import MAX_CHOICES_N, MAX_FRAME_BYTES, MAX_PRIORITY, MAX_REPLY_TOKENS
from chat.server.transport.url_fetch import check_hosts

MiB = 1024 * 1024
GiB = 1024 * MiB


YIELD_BUDGET_LEAST = 2  # chat.engine.scheduler.YIELD_BUDGET_RANGE[0] (not imported: it would load torch here)


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TURNCACHE_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0: any free port)")
    model: str = Field(
        "smollm2",
        description="model: 'smollm2', 'gemma3-270m', 'tiny-<name>', a local Hugging Face directory or a GGUF file",
    )
    dtype: str = Field("float32", pattern="^(float32|bfloat16)$", description="the dtype the model computes in")
    weights: str | None = Field(
        None,
        pattern="^(float32|bfloat16|int8|gguf|gguf-q8|gguf-q16)$",
        description="format of the linear layers' weights; gguf, gguf-q16, gguf-q8: a GGUF file's own blocks "
        "(default: gguf-q16 for a GGUF file, the built-in model too; else the dtype; int8: the throughput choice)",
    )
    kv_dtype: str | None = Field(
        None,
        pattern="^(float32|float16|bfloat16)$",
        description="what attention K/V are stored in (default: float16 with int8 or block-format weights where the "
        "native kernels run, else the dtype)",
    )
    lora: list[str] = Field(
        default_factory=list,
        description="LoRA adapters loaded at start, NAME=PATH[:SCALE] each (a PEFT adapter directory or a GGUF LoRA "
        "file); a request selects one with model: NAME",
    )
    max_loras: int = Field(
        4,
        ge=1,
        le=64,
        description="LoRA adapters kept in computing form at once (others wait on the host and are swapped in)",
    )
    chat_template: str | None = Field(
        None,
        description="a chat template file, or the template text (Jinja, rendered sandboxed), instead of the model's "
        "own; a model without one (a base model) serves completions only",
    )
    max_batch: int = Field(32, ge=1, le=256, description="most turns in one batched forward")
    threads: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1, le=256, description="torch threads of the engine"
    )
    token_budget: int = Field(256, ge=16, le=8192, description="most tokens in one batched forward")
    yield_budget: int = Field(
        16,
        ge=0,
        le=8192,
        description="tokens per step of worse priorities while a better priority is around (0: off; else >= 2)",
    )
    yield_hold_s: float = Field(
        10.0, ge=0, le=3600, description="seconds a priority stays around after its last turn ended"
    )
    prefix_cache: bool = Field(True, description="reuse cached prefixes (off: --no-prefix-cache)")
    device_cache_mib: int = Field(1024, ge=0, description="prefix cache budget on the model's device, MiB")
    host_cache_mib: int = Field(2048, ge=0, description="prefix cache budget on the host (offload tier), MiB")
    cache_dir: str | None = Field(
        None, description="directory of the prefix cache's disk tier (None or '': no disk tier, nothing persists)"
    )
    disk_budget: int = Field(8 * GiB, ge=0, description="bytes the prefix cache's disk tier may hold (0: no disk tier)")
    tenant_cache_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="most of each prefix cache tier one tenant keeps while another tenant needs room (None: no limit)",
    )
    volatile_lines: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PATTERNS),
        description="regular expressions of prompt lines that carry per-request noise and no meaning for a local model "
        "(default: Claude Code's billing line); a match from a line's start is dropped from the rendered prompt, never "
        "from what a session stores, so that such lines do not split the prefix cache",
    )
    keep_volatile_lines: bool = Field(
        False, description="keep volatile lines in the prompt (a miss they cause is then named volatile_line)"
    )
    tenant_concurrent_turns: int | None = Field(
        None, ge=1, description="turns one tenant may run at once, unless its keys file entry says (None: no limit)"
    )
    tenant_requests_per_minute: int | None = Field(
        None, ge=1, description="requests one tenant may make per minute, unless its entry says (None: no limit)"
    )
    tenant_tokens_per_minute: int | None = Field(
        None, ge=1, description="prompt + completion tokens per minute of one tenant, unless its entry says"
    )
    tenant_open_sessions: int | None = Field(
        None, ge=1, description="sessions one tenant keeps in memory, unless its entry says (None: no limit)"
    )
    tenant_priority: int = Field(
        0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="priority of a turn that gives none (lower: sooner)"
    )
    auth_token: SecretStr | None = Field(None, description="if set, every request must carry it")
    api_keys_file: str | None = Field(None, description="a file of API keys and their tenants (see docs/security.md)")
    api_keys: SecretStr | None = Field(None, description="API keys and their tenants, in the keys file's format")
    keys_poll_s: float = Field(
        5.0, ge=0, description="seconds between looks at the keys file for a change to reload (0: only on SIGHUP)"
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="browser origins allowed besides the server's own (e.g. http://localhost:3000)",
    )
    served_model_aliases: list[str] = Field(
        default_factory=list,
        description="other model names requests may give for the model served (an exact name, or a glob such as "
        "'claude-*' so Claude Code's model names reach it); empty: only the served name",
    )
    max_body_mib: int = Field(32, ge=1, description="largest HTTP request body, MiB")
    media_url_hosts: list[str] = Field(
        default_factory=list,
        description="hosts whose https:// image URLs the HTTP API fetches ('*.example.com': its subdomains, "
        "'host:port': another port than 443); empty: media by URL is refused",
    )
    media_url_max_bytes: int = Field(20 * MiB, ge=1, description="most bytes of one image fetched by URL")
    media_url_timeout_s: float = Field(10.0, gt=0, le=120, description="seconds one image fetch may take in all")
    media_url_allow_private: bool = Field(
        False, description="let media hosts resolve to private, loopback or link-local addresses"
    )
    media_url_ca_file: str | None = Field(None, description="CA certificates for media hosts instead of the system's")

    @field_validator("yield_budget")
    @classmethod
    def _yield_budget(cls, value: int) -> int:
        if 0 < value < YIELD_BUDGET_LEAST:
            raise ValueError(f"must be 0 (off) or at least {YIELD_BUDGET_LEAST}")
        return value

    @field_validator("lora")
    @classmethod
    def _lora(cls, specs: list[str]) -> list[str]:
        from chat.server.surfaces.lora_api import parse_lora_spec

        names = [parse_lora_spec(spec)[0] for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError("an adapter name is given twice")
        return specs

    @field_validator("served_model_aliases")
    @classmethod
    def _aliases(cls, aliases: list[str]) -> list[str]:
        for alias in aliases:
            if not alias or len(alias) > 256 or any(c.isspace() for c in alias):
                raise ValueError(f"{alias!r}: a model name or glob of 1 to 256 characters, no spaces")
            if not alias.strip("*?"):
                raise ValueError(f"{alias!r} would accept any model name: give a prefix, e.g. 'claude-*'")
        return aliases

    @field_validator("volatile_lines")
    @classmethod
    def _volatile_lines(cls, patterns: list[str]) -> list[str]:
        VolatileLines(patterns)  # raises ValueError naming a pattern that does not compile
        return patterns

    @field_validator("media_url_hosts")
    @classmethod
    def _media_hosts(cls, hosts: list[str]) -> list[str]:
        return list(check_hosts(hosts))

    max_ws_frame_mib: int = Field(MAX_FRAME_BYTES // MiB, ge=1, description="largest WebSocket message, MiB")
    max_reply_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_REPLY_TOKENS,
        description="reply length when a request sets no max_tokens (None: up to the end of the context window)",
    )
    max_n: int = Field(MAX_CHOICES_N, ge=1, le=MAX_CHOICES_N, description="most replies one request may ask for (n)")
    max_sessions: int = Field(1000, ge=1, description="sessions kept in memory")
    stream_buffer_events: int = Field(
        4096,
        ge=16,
        description="events a streaming client may leave unread (per HTTP stream or WebSocket) before its turns are "
        "cancelled with slow_client and the connection closed; its turns pause before that, at 8 unread events a turn "
        "or half of this, until the client reads again",
    )
    send_timeout_s: float = Field(
        30.0, gt=0, description="seconds one write to a client may wait for it to read before the connection closes"
    )
    refusal_hold_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="seconds a request refused before its body is read, its tenant being over a limit (429), waits "
        "before its answer goes out (its retry time if shorter; 0: at once): a client that ignores Retry-After sends "
        "one request a hold on its connection instead of a flood (at most 256 answers wait at once)",
    )
    idle_connection_s: float = Field(
        30.0,
        gt=0,
        description="seconds an HTTP connection may stay open without sending a request (after opening, or after a "
        "response on a kept-alive connection) before it closes; keep it above clients' pool expiry (httpx: 5 s)",
    )
    send_buffer_kib: int | None = Field(
        None,
        ge=4,
        le=65536,
        description="each connection's kernel send buffer, KiB (the kernel doubles it; None: the kernel's own, which "
        "grows to net.ipv4.tcp_wmem's maximum): bounds what a client that stops reading holds in the kernel",
    )
    sessions_db: str | None = Field(
        None,
        description="where sessions persist across restarts: an SQLite file, or a postgresql:// URL (a database "
        "several processes share, e.g. a cluster's ingresses; stored responses are kept there too); None or '': memory "
        "only",
    )
