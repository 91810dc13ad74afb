"""chat/cluster/launch.py without a Ray cluster: the application it builds (bound, not run), what every worker gets in
its environment, how it joins or starts Ray, why a failed start failed, and the refusals before Ray starts. The app
running on a live cluster: test_live.py and test_live_ingresses.py."""

import http.server
import signal
import threading
from types import SimpleNamespace

import pytest

import chat.cluster.launch as launch
from chat.cli import main
from chat.cluster.launch import (
    HEAD_NODE,
    PROXY_CALLBACK,
    PROXY_CALLBACK_ENV,
    SOURCE_ROOT,
    answers,
    build_application,
    check_layout,
    deploy_failure,
    engine_version,
    free_port,
    proxy_environment,
    runtime_env,
)
from chat.cluster.settings import ClusterSettings
from chat.server.settings import ServerSettings

PG = "postgresql://turncache@db.example:5432/turncache"


def test_a_bad_keys_file_is_refused_before_ray_starts(monkeypatch, tmp_path):
    monkeypatch.delenv("TURNCACHE_REPLICAS", raising=False)
    monkeypatch.setattr(launch, "connect", lambda *a, **k: pytest.fail("Ray was started"))
    missing = str(tmp_path / "no-such-keys")
    with pytest.raises(SystemExit, match=r"--api-keys-file .*cannot be read"):
        main(["serve", "--replicas", "2", "--api-keys-file", missing, "--sessions-db", ""])


def test_several_ingresses_need_a_shared_sessions_database_and_are_refused_before_ray_starts(monkeypatch, tmp_path):
    monkeypatch.delenv("TURNCACHE_REPLICAS", raising=False)
    monkeypatch.setattr(launch, "connect", lambda *a, **k: pytest.fail("Ray was started"))
    for db in ("", str(tmp_path / "s.sqlite3")):
        with pytest.raises(SystemExit, match=r"--ingresses 2 needs --sessions-db postgresql://"):
            main(["serve", "--replicas", "2", "--ingresses", "2", "--sessions-db", db])


def test_the_engine_version_ignores_the_ingress_layout_but_not_the_engines_settings():
    settings = ServerSettings(model="tiny-llama")
    one = engine_version(settings, ClusterSettings(replicas=2, ingresses=1))
    assert one == engine_version(settings, ClusterSettings(replicas=2, ingresses=2, proxy_location="EveryNode"))
    assert one != engine_version(settings, ClusterSettings(replicas=2, replica_cpus=2))
    assert one != engine_version(settings.model_copy(update={"model": "smollm2"}), ClusterSettings(replicas=2))


def test_one_ingress_may_keep_sessions_anywhere_and_several_share_postgresql_only():
    check_layout(ServerSettings(sessions_db="s.sqlite3"), ClusterSettings(replicas=2))
    check_layout(ServerSettings(sessions_db=PG), ClusterSettings(replicas=2, ingresses=3))
    with pytest.raises(ValueError, match=r"with sessions in memory"):
        check_layout(ServerSettings(sessions_db=None), ClusterSettings(replicas=2, ingresses=2))
    with pytest.raises(ValueError, match=r"an SQLite file \(s.sqlite3\)"):
        check_layout(ServerSettings(sessions_db="s.sqlite3"), ClusterSettings(replicas=2, ingresses=2))


def test_every_worker_gets_this_source_first_on_its_path_the_model_home_and_no_hub(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/extra:{SOURCE_ROOT}:/extra")
    monkeypatch.setenv("TURNCACHE_HOME", "/models")
    env = runtime_env()["env_vars"]
    assert env == {"PYTHONPATH": f"{SOURCE_ROOT}:/extra", "HF_HUB_OFFLINE": "1", "TURNCACHE_HOME": "/models"}
    monkeypatch.delenv("TURNCACHE_HOME")
    monkeypatch.delenv("PYTHONPATH")
    assert runtime_env()["env_vars"] == {"PYTHONPATH": str(SOURCE_ROOT), "HF_HUB_OFFLINE": "1"}


def test_the_proxy_environment_names_a_middleware_factory_that_imports(monkeypatch):
    import importlib

    monkeypatch.setenv("PYTHONPATH", "/extra")
    env = proxy_environment()
    assert env == {PROXY_CALLBACK_ENV: PROXY_CALLBACK, "PYTHONPATH": f"{SOURCE_ROOT}:/extra"}
    module, name = PROXY_CALLBACK.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))


def _bound(app):
    """The deployment of a bound application (Ray Serve 2.60's attribute; the version is pinned)."""
    return app._bound_deployment


def test_the_application_places_a_file_stores_one_ingress_on_the_head_node_and_gives_no_worker_a_key(tmp_path):
    settings = ServerSettings(model="tiny-llama", sessions_db="s.sqlite3", api_keys="sk-0123456789abcdef tenant-a")
    cluster = ClusterSettings(replicas=3, max_turns_per_replica=5, replica_cpus=2, max_replicas_per_node=1)
    ingress = _bound(build_application(settings, cluster))
    engines_app, ingress_settings, keys, policy, block_tokens = ingress.init_args
    assert ingress.name == "ClusterIngress" and ingress.num_replicas == 1
    assert ingress.ray_actor_options["resources"] == {HEAD_NODE: 0.001} and ingress.ray_actor_options["num_cpus"] == 0
    assert ingress_settings.sessions_db == str((launch.Path.cwd() / "s.sqlite3").resolve())  # this node's file
    assert ingress_settings.api_keys is None and keys is not None  # the ingress gets digests, no worker the keys
    assert policy == {"mode": cluster.router, "imbalance": cluster.route_imbalance}
    assert block_tokens == cluster.route_block_tokens
    engines = _bound(engines_app)
    engine_settings, threads = engines.init_args
    assert (engines.num_replicas, engines.max_ongoing_requests, threads) == (3, 5, 2)
    assert engines.ray_actor_options["num_cpus"] == 2 and engine_settings.api_keys is None
    assert engines.version == engine_version(ingress_settings, cluster)


def test_ingresses_sharing_postgresql_may_run_on_any_node():
    app = build_application(
        ServerSettings(model="tiny-llama", sessions_db=PG), ClusterSettings(replicas=2, ingresses=2)
    )
    ingress = _bound(app)
    assert ingress.num_replicas == 2 and "resources" not in ingress.ray_actor_options
    assert ingress.init_args[1].sessions_db == PG


def test_connect_joins_a_cluster_as_it_is_or_starts_a_local_one_with_the_proxy_environment(monkeypatch):
    calls = []
    monkeypatch.setattr(launch.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv(PROXY_CALLBACK_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", "")
    assert launch.connect("ray://head:10001") is False
    assert calls[-1]["address"] == "ray://head:10001" and PROXY_CALLBACK_ENV not in launch.os.environ
    assert launch.connect(None, num_cpus=3) is True
    assert (calls[-1]["address"], calls[-1]["num_cpus"], calls[-1]["include_dashboard"]) == ("local", 3, False)
    assert launch.os.environ[PROXY_CALLBACK_ENV] == PROXY_CALLBACK  # set before the local Ray inherits it


def test_a_failed_start_is_explained_by_each_failed_deployments_last_line(monkeypatch):
    def status(deployments, message="the app failed"):
        return SimpleNamespace(applications={"turncache": SimpleNamespace(deployments=deployments, message=message)})

    failed = SimpleNamespace(
        status="DeploymentStatus.DEPLOY_FAILED", message="Traceback ...\n  UnknownModelError: nope\n"
    )
    healthy = SimpleNamespace(status="DeploymentStatus.HEALTHY", message="")
    monkeypatch.setattr(launch.serve, "status", lambda: status({"EngineReplica": failed, "ClusterIngress": healthy}))
    assert deploy_failure() == "EngineReplica: UnknownModelError: nope"
    monkeypatch.setattr(launch.serve, "status", lambda: status({"ClusterIngress": healthy}))
    assert deploy_failure() == "the app failed"

    def gone():
        raise ConnectionError("no controller")

    monkeypatch.setattr(launch.serve, "status", gone)
    assert deploy_failure() == "Ray Serve did not report why"


def test_the_app_answers_when_its_health_does_on_the_host_it_listens_on():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert answers(ServerSettings(host="0.0.0.0", port=server.server_address[1]))  # asked on loopback
    finally:
        server.shutdown()
        server.server_close()
    assert not answers(ServerSettings(host="127.0.0.1", port=free_port()))


def test_a_cluster_that_does_not_start_exits_naming_why_and_shuts_ray_down(monkeypatch):
    stopped = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(launch, "connect", lambda address: True)
    monkeypatch.setattr(launch, "deploy", lambda settings, cluster: (_ for _ in ()).throw(RuntimeError("failed")))
    monkeypatch.setattr(launch, "deploy_failure", lambda: "EngineReplica: UnknownModelError: nope")
    monkeypatch.setattr(launch.serve, "shutdown", lambda: stopped.append("serve"))
    monkeypatch.setattr(launch.ray, "shutdown", lambda: stopped.append("ray"))
    settings = ServerSettings(model="nope", port=0, sessions_db=None)
    with pytest.raises(SystemExit, match="the cluster did not start: EngineReplica: UnknownModelError: nope"):
        launch.serve_cluster(settings, ClusterSettings(replicas=2))
    assert stopped == ["serve", "ray"]  # started here: Serve and Ray both stopped
    assert {sig: signal.getsignal(sig) for sig in before} == before  # the handlers given back


def test_a_ray_that_cannot_be_joined_is_a_clear_exit(monkeypatch):
    def refused(address):
        raise ConnectionError("wrong token")

    monkeypatch.setattr(launch, "connect", refused)
    cluster = ClusterSettings(replicas=2, ray_address="ray://head:10001")
    with pytest.raises(SystemExit, match=r"cannot start or join Ray \(ray://head:10001\): wrong token"):
        launch.serve_cluster(ServerSettings(sessions_db=None), cluster)
