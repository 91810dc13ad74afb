"""ClusterIngress: an HTTP/WebSocket front of a cluster (one of ``--ingresses M``), as a Ray Serve deployment.

Its app is the single-process server's (``chat.server.app.create_app``) over a :class:`RemoteEngine`, so the web UI,
``/v1/chat/completions``, ``/v1/models``, ``/health``, the auth checks and limits are that code. Three routes are
the cluster's own, placed before the others:

- ``/v1/ws``: the same ``serve_socket`` (origin and token checks, the protocol state machine), given a per-socket
  engine that tags session turns with their session (see :mod:`chat.cluster.remote_engine`);
- ``/metrics``: every live replica's single-process ``/metrics`` with a ``replica`` label, plus the routing
  families ``turncache_cluster_*``;
- ``/v1/cluster``: the routing table as JSON (the answering ingress: its id, Ray node and process; replicas, their
  node once known, turns in flight, sessions and prefix blocks last routed there, turns routed by rule).

Every response and WebSocket handshake names the ingress that answered in ``x-turncache-ingress``.

The protocol state machine and the session store run here, not in the replicas: a replica that dies takes no session
with it. The store is the server's (``--sessions-db``): SQLite on the head node with one ingress, or the PostgreSQL
database every ingress shares (``chat/server/persistence/pg_sessions.py``), so a session opened through one ingress
resumes through any other, and every ingress routes its turns alike (``chat/cluster/routing.py``). It is closed (what is
pending written) when Ray Serve stops the ingress. API keys arrive as a :class:`KeyRing` built where the cluster was
started (:func:`chat.cluster.launch.build_application`): only their digests travel, and tenants are the single
process's.
"""

from __future__ import annotations

import dataclasses
import os

import ray
from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse
from ray import serve

from chat.cluster import metrics_merge
from chat.cluster.prompt_keys import PromptKeyer
from chat.cluster.ray_router import table_name
from chat.cluster.remote_engine import RemoteEngine, SessionTracker, SocketEngine
from chat.cluster.routing import RoutingPolicy, table_for
from chat.engine.runtime import ChatRenderer
from chat.server.settings import ServerSettings
from chat.server.tenancy.auth import KeyRing

ENGINE_DEPLOYMENT = "EngineReplica"  # the engine deployment's name (the router's table is named after it)


class ClusterIngress:
    async def __init__(self, engines, settings: ServerSettings, keys: KeyRing, policy: dict, block_tokens: int) -> None:
        """``engines``: the EngineReplica deployment's handle; ``keys``: the cluster's API keys (settings carry none).

        Raises chat.models' typed errors.
        """
        from chat.models import load_renderer

        self.settings = settings
        self.keys = keys  # API keys -> tenants, for every route
        # The model's chat template renders prompt keys; its modalities check media parts. No weights: the replicas
        # hold those.
        self.runtime: ChatRenderer = load_renderer(settings.model, settings.chat_template)
        self.policy = RoutingPolicy(**policy)
        app_name = serve.get_replica_context().app_name
        self.table = table_for(table_name(app_name, ENGINE_DEPLOYMENT), self.policy)  # shared with the router
        from chat.engine.volatile_lines import VolatileLines

        volatile = VolatileLines(settings.volatile_lines, drop=not settings.keep_volatile_lines)  # as the replicas'
        # engines (chat.server.main.volatile_lines): routing keys must not see the lines their prompts lack
        render = self.runtime.render

        def render_key(messages: list[dict[str, str]]) -> list[int]:
            return render(list(volatile.prompt_messages(messages)))

        keyer = PromptKeyer(render_key, block_tokens) if self.policy.mode == "prefix" else None
        self.remote = RemoteEngine(engines, self.runtime, self.table, keyer)
        self.node = ray.get_runtime_context().get_node_id()  # where this ingress runs
        self.replica = serve.get_replica_context().replica_id.unique_id  # this ingress's id
        self.pid = os.getpid()
        self.sessions = None  # the app's session store, once Ray Serve built the app (__serve_build_asgi_app__)
        await self.remote.describe()  # builds this process's router; waits until a replica runs

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Called once by Ray Serve. Raises SessionDbError when ``sessions_db`` cannot be opened."""
        from chat.server.app import create_app

        app = create_app(self.remote, self.settings, model_name=self.runtime.name, keys=self.keys)
        me = {"replica": self.replica, "node": self.node, "pid": self.pid}
        add_cluster_routes(app, self.remote, self.settings, self.keys, self.policy, me)
        self.sessions = app.state.sessions
        return app

    async def routing_log(self) -> list[dict]:
        """Recent turns and the replica that ran each (for operators and tests, through a deployment handle)."""
        return [dataclasses.asdict(r) for r in self.remote.log]

    def __del__(self) -> None:
        """Ray Serve calls this when it stops the ingress: the session store writes what is pending and closes."""
        sessions = getattr(self, "sessions", None)  # (__init__ may have failed before setting it)
        if sessions is not None:
            sessions.close()


def add_cluster_routes(
    app: FastAPI, remote: RemoteEngine, settings: ServerSettings, keys: KeyRing, policy: RoutingPolicy, me: dict
) -> None:
    """``me``: this ingress's Ray Serve replica id, Ray node and process id (``/v1/cluster`` names them)."""
    """Put the cluster's ``/v1/ws``, ``/metrics`` and ``/v1/cluster`` before the app's own routes."""
    from chat.server.metrics_text import render_session_metrics
    from chat.server.persistence.session_backends import DurableSessionStore
    from chat.server.surfaces.ws import serve_socket

    before = len(app.router.routes)
    store = app.state.sessions

    async def chat_socket(ws: WebSocket) -> None:  # create_app's /v1/ws, with a per-socket engine and store view
        tracker = SessionTracker(store)
        await serve_socket(
            ws,
            SocketEngine(remote, tracker),
            tracker,
            remote.runtime.name,
            keys=app.state.keys,
            gate=app.state.gate,
            allowed_origins=settings.allowed_origins,
            reply_cap=settings.max_reply_tokens,
        )

    async def metrics() -> PlainTextResponse:
        reports = await remote.reports()
        text = metrics_merge.merge((r.replica, r.metrics_text) for r in reports)
        text += metrics_merge.routing_families(remote.table.snapshot(), remote.lost_turns)
        if isinstance(store, DurableSessionStore):  # the sessions database is the ingresses': no replica label
            text += render_session_metrics(*store.write_stats())
        return PlainTextResponse(text)

    async def cluster() -> JSONResponse:
        views = remote.table.snapshot()
        return JSONResponse(
            {
                "model": remote.runtime.name,
                "ingress_node": me["node"],
                "ingress": me,  # the ingress that answered (with several, each request may reach another)
                "router": policy.mode,
                "route_imbalance": policy.imbalance,
                "replicas": [{**dataclasses.asdict(v), "node": remote.nodes.get(v.replica)} for v in views],
                "turns_inflight": remote.table.inflight(),
                "lost_turns": remote.lost_turns,
            }
        )

    app.add_middleware(IngressHeader, ingress=me["replica"])
    app.add_api_websocket_route("/v1/ws", chat_socket)
    app.add_api_route("/metrics", metrics, methods=["GET"], response_class=PlainTextResponse)
    app.add_api_route("/v1/cluster", cluster, methods=["GET"])
    routes = app.router.routes
    routes[:] = routes[before:] + routes[:before]


INGRESS_HEADER = "x-turncache-ingress"  # names the ingress that answered (a response, a WebSocket's handshake)


class IngressHeader:
    """Names this ingress (its Ray Serve replica id) on every response and WebSocket handshake it answers: with
    several ingresses behind the proxy, the client (and an operator reading logs) sees which one served it."""

    def __init__(self, app, ingress: str) -> None:
        self.app = app
        self.header = (INGRESS_HEADER.encode(), ingress.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def named(message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)
