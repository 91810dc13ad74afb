"""What the route modules share: the engine, the settings, the model's name, the tenants' keys and gate, the session
and response stores, the one admission, the LoRA adapters; and how a stream is answered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chat.server.persistence.response_store import ResponseStore
from chat.server.reply.adapters import AdapterSelector
from chat.server.reply.admission import Admission
from chat.server.settings import ServerSettings
from chat.server.tenancy.key_store import KeyStore
from chat.server.tenancy.tenant_gate import TenantGate
from chat.server.transport.backpressure import TimedStreamingResponse


@dataclass(frozen=True, slots=True)
class ServerParts:
    engine: Any  # the engine (or a cluster's RemoteEngine)
    settings: ServerSettings
    model_name: str  # the model served
    keys: KeyStore  # the API keys, reloaded on SIGHUP and when the file changes
    gate: TenantGate  # the tenants' limits and engine views
    sessions: Any  # the WebSocket's session store (InMemorySessionStore or SqliteSessionStore)
    responses: ResponseStore  # /v1/responses kept for previous_response_id, per tenant
    admission: Admission  # check model -> check grammar -> admit, for every route
    adapters: AdapterSelector  # the LoRA adapters loaded now, which a request's `model` may name

    def stream(self, events) -> TimedStreamingResponse:
        """A server-sent event stream of ``events`` (bytes or str), each write bounded by ``--send-timeout-s``."""
        timeout = self.settings.send_timeout_s
        return TimedStreamingResponse(events, media_type="text/event-stream", send_timeout_s=timeout)
