"""Build the Ray Serve application of a cluster, start or join Ray, and run ``turncache serve --replicas N``.

The application: ``ClusterIngress`` x M (``--ingresses``, no CPU reserved) in front of ``EngineReplica`` x N, routed
by ``TurncacheRouter``. Ray Serve's HTTP proxy (on the head node, or on every node: ``--proxy-location``) listens on
``--host`` / ``--port`` and hands every request (a WebSocket for its whole life) to one of the ingresses. With an
SQLite ``--sessions-db`` (a file) or none, there is one ingress, on the head node; several ingresses need a
``postgresql://`` one, which they share, and may run anywhere.

Workers import this package from the same place as this process (its directory is put on their ``PYTHONPATH``):
on other machines turncache must be installed at the same version (see docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import ray
from ray import serve
from ray.serve.config import HTTPOptions, RequestRouterConfig
from ray.serve.schema import LoggingConfig

from chat.cluster.ingress import ENGINE_DEPLOYMENT, ClusterIngress
from chat.cluster.replica import EngineReplica
from chat.cluster.settings import ClusterSettings, without_keys
from chat.server.app import key_ring
from chat.server.persistence.session_backends import is_postgres
from chat.server.settings import ServerSettings

APP_NAME = "turncache"  # the Ray Serve application's name
INGRESS_DEPLOYMENT = "ClusterIngress"
ROUTER_CLASS = "chat.cluster.ray_router.TurncacheRouter"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the chat, cache and modalities packages
QUIET = LoggingConfig(log_level="WARNING", enable_access_log=False)
HEAD_NODE = "node:__internal_head__"  # the resource Ray gives the head node only
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"  # Ray Serve's proxy middlewares, by import path
PROXY_CALLBACK = "chat.cluster.proxy_guard.middlewares"


def runtime_env() -> dict:
    """What every worker of this job needs: this package on its path, the same model home, no Hub access."""
    paths = [str(SOURCE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "HF_HUB_OFFLINE": "1"}
    for name in ("TURNCACHE_HOME",):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return {"env_vars": env}


def build_application(settings: ServerSettings, cluster: ClusterSettings):
    """The bound application (``serve.run`` it). Nothing starts until then.

    The API keys are read here, in this process (relative paths are this process's): the ingress gets them as a
    KeyRing of digests, and no worker gets the keys themselves.

    Raises:
        KeysError: a keys source is unreadable or malformed.
    """
    check_layout(settings, cluster)
    keys = key_ring(settings)
    settings = without_keys(settings)
    shared = is_postgres(settings.sessions_db)
    if settings.sessions_db and not shared:  # the ingress opens the file on this (the head) node, from its directory
        settings = settings.model_copy(update={"sessions_db": str(Path(settings.sessions_db).expanduser().resolve())})
    policy = {"mode": cluster.router, "imbalance": cluster.route_imbalance}
    engine_options: dict = {
        "name": ENGINE_DEPLOYMENT,
        "num_replicas": cluster.replicas,
        "max_ongoing_requests": cluster.max_turns_per_replica,
        "ray_actor_options": {"num_cpus": cluster.replica_cpus, "runtime_env": runtime_env()},
        "request_router_config": RequestRouterConfig(
            request_router_class=ROUTER_CLASS, request_router_kwargs={"policy": policy}
        ),
        "logging_config": QUIET,
        "graceful_shutdown_timeout_s": 5,
        "health_check_period_s": 5,
    }
    if cluster.max_replicas_per_node is not None:
        engine_options["max_replicas_per_node"] = cluster.max_replicas_per_node
    # A version of what the replicas are built from: redeploying the app with other ingress settings (another
    # --ingresses) keeps the running replicas and their caches, where Ray Serve would give every deploy a new random
    # version and restart them all (an internal option of the pinned Ray Serve 2.60).
    engines = serve.deployment(EngineReplica, **engine_options).options(
        version=engine_version(settings, cluster), _internal=True
    )
    placement = {} if shared else {"resources": {HEAD_NODE: 0.001}}
    ingress = serve.deployment(
        serve.ingress()(ClusterIngress),
        name=INGRESS_DEPLOYMENT,
        num_replicas=cluster.ingresses,
        max_ongoing_requests=settings.max_sessions + 256,  # each open WebSocket is one request for its whole life
        # A file store (SQLite) is on the head node, found again after a restart: its one ingress runs there. A shared
        # database (PostgreSQL) is reached from anywhere.
        ray_actor_options={"num_cpus": 0, **placement, "runtime_env": runtime_env()},
        logging_config=QUIET,
        graceful_shutdown_timeout_s=5,
    )
    threads = max(1, int(cluster.replica_cpus))
    return ingress.bind(engines.bind(settings, threads), settings, keys, policy, cluster.route_block_tokens)


def engine_version(settings: ServerSettings, cluster: ClusterSettings) -> str:
    """A digest of everything the engine replicas are built from (not the ingresses' layout)."""
    engine = cluster.model_dump(exclude={"ingresses", "proxy_location", "ray_address"})
    text = json.dumps([settings.model_dump(mode="json"), engine], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_layout(settings: ServerSettings, cluster: ClusterSettings) -> None:
    """Raises ValueError (its message for the user) when the ingresses cannot share the sessions as asked."""
    if cluster.ingresses > 1 and not is_postgres(settings.sessions_db):
        where = f"an SQLite file ({settings.sessions_db})" if settings.sessions_db else "memory"
        raise ValueError(
            f"--ingresses {cluster.ingresses} needs --sessions-db postgresql://...: with sessions in {where}, a "
            "session resumed through another ingress would not be found"
        )


def proxy_environment() -> dict[str, str]:
    """What a Ray node's processes need in their environment for the proxy to end streams of a lost ingress with a
    typed error (``chat.cluster.proxy_guard``): its import path, and this package on the path."""
    paths = [str(SOURCE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {PROXY_CALLBACK_ENV: PROXY_CALLBACK, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def connect(address: str | None, *, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start a local one (no dashboard); True when it was started here.

    A local Ray inherits this process's environment: :func:`proxy_environment` is set first (a joined cluster's nodes
    need it exported before ``ray start``, docs/cluster.md)."""
    if address:
        ray.init(address=address, runtime_env=runtime_env(), logging_level=logging.WARNING, log_to_driver=False)
        return False
    os.environ.update(proxy_environment())
    ray.init(
        address="local",  # a new instance, even when `ray start` left one running on this machine
        num_cpus=num_cpus,
        include_dashboard=False,
        runtime_env=runtime_env(),
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    return True


def deploy(settings: ServerSettings, cluster: ClusterSettings, *, name: str = APP_NAME, route_prefix: str = "/"):
    """Start Serve's proxy on ``settings.host:settings.port`` (the first time) and run the app; returns the
    ingress's handle when every replica is up. The caller must be connected to Ray (:func:`connect`)."""
    return deploy_many([(name, route_prefix, settings, cluster)])[0]


def deploy_many(apps: Sequence[tuple[str, str, ServerSettings, ClusterSettings]]) -> list:
    """Several apps ``(name, route_prefix, settings, cluster)`` started together (replicas load in parallel); the
    proxy listens where the first one's settings say. Returns their ingresses' handles."""
    first, layout = apps[0][2], apps[0][3]
    serve.start(http_options=HTTPOptions(host=first.host, port=first.port), proxy_location=layout.proxy_location)
    targets = [serve.RunTarget(target=build_application(s, c), name=n, route_prefix=p) for n, p, s, c in apps]
    return serve.run_many(targets)


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_ray(*, num_cpus: int | None = None) -> Iterator[None]:
    """A new local Ray instance for the block (benchmarks); Serve and Ray are shut down after it."""
    connect(None, num_cpus=num_cpus)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def answers(settings: ServerSettings) -> bool:
    """Whether the app's /health answers where the settings say it listens."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    try:
        with urllib.request.urlopen(f"http://{host}:{settings.port}/health", timeout=5) as response:
            return response.status == 200
    except OSError:  # refused, timed out, or an HTTP error status
        return False


def deploy_failure(name: str = APP_NAME) -> str:
    """Why the app did not start: the last line of each failed deployment's error (a replica's exception)."""
    try:
        app = serve.status().applications[name]
    except Exception:  # Serve itself is gone: nothing more to say
        return "Ray Serve did not report why"
    reasons = []
    for deployment, status in app.deployments.items():
        lines = [line for line in (status.message or "").splitlines() if line.strip()]
        if lines and "FAILED" in str(status.status):
            reasons.append(f"{deployment}: {lines[-1].strip()}")
    return "; ".join(dict.fromkeys(reasons)) or app.message


def serve_cluster(settings: ServerSettings, cluster: ClusterSettings) -> int:
    """``turncache serve --replicas N``: run until SIGINT or SIGTERM, then stop the app (and Ray, if started here).

    Raises:
        SystemExit: the app did not start (the message names the replica's error, e.g. an unknown model).
        KeysError: a keys source is unreadable or malformed (before Ray starts).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.port == 0:
        settings = settings.model_copy(update={"port": free_port(settings.host)})
    key_ring(settings)  # a malformed keys file is refused before Ray starts (KeysError)
    try:
        check_layout(settings, cluster)
    except ValueError as exc:
        raise SystemExit(f"turncache: {exc}") from None
    where = cluster.ray_address or "a local Ray instance"
    print(
        f"turncache: starting {cluster.replicas} replica(s) of {settings.model} behind {cluster.ingresses} "
        f"ingress(es) on {where} (router: {cluster.router}) ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        started = connect(cluster.ray_address)
    except Exception as exc:  # unreachable, wrong token (Ray's message says which), version mismatch...
        raise SystemExit(f"turncache: cannot start or join Ray ({where}): {exc}") from exc
    stop = threading.Event()  # after ray.init, which installs a SIGTERM handler of its own
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            deploy(settings, cluster)
        except RuntimeError as exc:
            raise SystemExit(f"turncache: the cluster did not start: {deploy_failure()}") from exc
        if not answers(settings):
            print(
                f"turncache: nothing answers on {settings.host}:{settings.port}: Ray Serve was already running on this "
                "cluster with other HTTP options (they are set once per cluster; see `serve status`)",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"turncache: serving {settings.model} on http://{settings.host}:{settings.port}/", flush=True)
        stop.wait()
        print("turncache: stopping", file=sys.stderr, flush=True)
    finally:
        for sig in previous:  # a second Ctrl-C must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            serve.shutdown() if started else serve.delete(APP_NAME)
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
