"""Settings of a cluster (``turncache serve --replicas N``), from flags or ``TURNCACHE_*`` variables; flags win.

The engine settings (model, cache budgets, auth, sessions database) stay in :class:`chat.server.settings.ServerSettings`
and apply to every replica and to the ingress alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from chat.server.settings import ServerSettings

RouterMode = Literal["prefix", "round_robin"]
ProxyLocation = Literal["HeadOnly", "EveryNode", "Disabled"]
KEY_FIELDS = ("auth_token", "api_keys_file", "api_keys")  # ServerSettings fields that name or hold API keys


def without_keys(settings: ServerSettings) -> ServerSettings:
    """``settings`` with no API key source: what travels to Ray's workers (the ingress gets a KeyRing instead)."""
    return settings.model_copy(update=dict.fromkeys(KEY_FIELDS))


class ClusterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TURNCACHE_", extra="ignore")

    replicas: int = Field(ge=1, le=64, description="engine replicas (each: the model, its prefix cache, an engine)")
    ingresses: int = Field(
        1,
        ge=1,
        le=64,
        description="ingress replicas (the HTTP/WebSocket front); above 1 needs a shared --sessions-db postgresql://",
    )
    proxy_location: ProxyLocation = Field(
        "HeadOnly",
        description="where Ray Serve runs an HTTP proxy, which spreads connections over the ingresses: 'HeadOnly', "
        "'EveryNode' (each node listens on --port), 'Disabled'",
    )
    ray_address: str | None = Field(
        None, description="a running Ray cluster to join ('auto', 'HOST:PORT'); None starts a local one"
    )
    router: RouterMode = Field(
        "prefix",
        description="'prefix': rendezvous hashing of the session or the conversation's opening, moved by load; "
        "'round_robin': comparison",
    )
    route_imbalance: int = Field(
        4,
        ge=0,
        description="a turn leaves its key's replica (for the next one of the key's order) when that replica runs "
        "more than this many turns more than the least-loaded one",
    )
    route_block_tokens: int = Field(32, ge=1, le=4096, description="tokens per block of the prefix routing key")
    replica_cpus: float = Field(
        1.0, ge=0, description="Ray CPUs reserved per replica (also its torch threads, at least 1)"
    )
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="at most this many replicas on one Ray node (1: one per machine)"
    )
    max_turns_per_replica: int = Field(
        256, ge=1, description="turns running on one replica before Ray Serve queues more (its max_ongoing_requests)"
    )
