"""`turncache serve --replicas`: flags, and no Ray without them."""

import subprocess
import sys
from pathlib import Path

import pytest

from chat.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_serve_without_replicas_runs_the_single_process_server_and_imports_no_ray():
    script = (
        "import sys\n"
        "import chat.server.main as server_main\n"
        "seen = {}\n"
        "server_main.serve = lambda settings: seen.setdefault('model', settings.model) and 0\n"
        "from chat.cli import main\n"
        "assert main(['serve', '--model', 'tiny-llama', '--sessions-db', '']) == 0\n"
        "assert seen == {'model': 'tiny-llama'}, seen\n"
        "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray was imported'\n"
        "print('ok')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("flag", [["--router", "round_robin"], ["--ray-address", "auto"], ["--replica-cpus", "2"]])
def test_cluster_flags_need_replicas(flag, monkeypatch):
    monkeypatch.delenv("TURNCACHE_REPLICAS", raising=False)
    with pytest.raises(SystemExit, match="needs --replicas N"):
        main(["serve", *flag])


def test_bad_cluster_settings_are_refused_with_the_flag_named(monkeypatch):
    monkeypatch.delenv("TURNCACHE_REPLICAS", raising=False)
    with pytest.raises(SystemExit, match="--replicas"):
        main(["serve", "--replicas", "0"])
    with pytest.raises(SystemExit, match="--route-imbalance"):
        main(["serve", "--replicas", "2", "--route-imbalance", "-1"])


def test_replicas_start_a_cluster_with_the_flags_given(monkeypatch):
    import chat.cluster.launch as launch

    seen = {}
    monkeypatch.setattr(launch, "serve_cluster", lambda settings, cluster: seen.update(s=settings, c=cluster) or 0)
    args = ["serve", "--model", "tiny-llama", "--replicas", "3", "--router", "round_robin", "--route-imbalance", "7"]
    assert main([*args, "--max-replicas-per-node", "1", "--sessions-db", ""]) == 0
    cluster = seen["c"]
    assert (cluster.replicas, cluster.router, cluster.route_imbalance, cluster.max_replicas_per_node) == (
        3,
        "round_robin",
        7,
        1,
    )
    assert seen["s"].model == "tiny-llama" and cluster.ray_address is None


def test_replicas_may_come_from_the_environment(monkeypatch):
    import chat.cluster.launch as launch

    seen = {}
    monkeypatch.setattr(launch, "serve_cluster", lambda settings, cluster: seen.update(c=cluster) or 0)
    monkeypatch.setenv("TURNCACHE_REPLICAS", "2")
    assert main(["serve", "--sessions-db", ""]) == 0
    assert seen["c"].replicas == 2 and seen["c"].router == "prefix"


def test_ingresses_and_the_proxy_location_reach_the_cluster_settings(monkeypatch):
    import chat.cluster.launch as launch

    seen = {}
    monkeypatch.setattr(launch, "serve_cluster", lambda settings, cluster: seen.update(s=settings, c=cluster) or 0)
    url = "postgresql://turncache@db.example:5432/turncache"
    args = ["serve", "--replicas", "2", "--ingresses", "3", "--proxy-location", "EveryNode", "--sessions-db", url]
    assert main(args) == 0
    assert (seen["c"].ingresses, seen["c"].proxy_location, seen["s"].sessions_db) == (3, "EveryNode", url)
    with pytest.raises(SystemExit, match="needs --replicas N"):
        main(["serve", "--ingresses", "2"])
