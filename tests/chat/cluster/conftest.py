"""One Ray cluster for the live test files (test_live.py, test_live_ingresses.py: one xdist worker runs both, in file
order, tests/conftest.py).

Ray is started once and ended after the last test that needs it: a second start on a busy 2-core machine (the
other worker's tests beside it) can outlast Ray's own 30 s waits for its GCS and raylet (CI failed so), and each start
costs 10-35 s. Each file's module fixture deploys its apps on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


@dataclass
class SharedRay:
    """Two Ray nodes on loopback (``ray.cluster_utils.Cluster``, 2 CPUs each) and the port Serve's proxy listens on,
    started on first use."""

    nodes: object = None
    port: int = 0
    environment: pytest.MonkeyPatch = field(default_factory=pytest.MonkeyPatch)

    def up(self) -> SharedRay:
        """The cluster, with no Serve app running (an earlier file's apps are deleted: the next deploys at the same
        route)."""
        if self.nodes is not None:
            from ray import serve

            for name in serve.status().applications:
                serve.delete(name)
        else:
            from ray.cluster_utils import Cluster

            from chat.cluster.launch import connect, free_port, proxy_environment

            # the nodes' processes inherit this process's environment (restored by down()): the proxy's guard (as
            # `ray start` gets it, docs/cluster.md); a proxy that spreads connections over every ingress (by default
            # Serve's proxy sends each to an ingress on its own node while one lives there, docs/cluster.md); a
            # longer wait for the GCS's port than Ray's default 30 s on a busy machine
            for name, value in {
                **proxy_environment(),
                "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
                "RAY_gcs_server_port_wait_time_s": "120",
            }.items():
                self.environment.setenv(name, value)
            nodes = None
            try:
                nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
                nodes.add_node(num_cpus=2)
                connect(nodes.address)
            except BaseException:
                if nodes is not None:
                    nodes.shutdown()
                self.environment.undo()
                raise
            self.nodes, self.port = nodes, free_port()
        return self

    def down(self) -> None:
        """No serve.shutdown(): its graceful drain of every replica took seconds; the nodes' end kills them all."""
        if self.nodes is not None:
            import ray

            ray.shutdown()
            self.nodes.shutdown()
            self.nodes = None
        self.environment.undo()


SHARED = SharedRay()


@pytest.fixture(scope="session")
def ray_nodes():
    """The shared cluster; a module fixture calls ``up()`` (it starts Ray again if it was ended). Ended after the last
    test that uses it (``pytest_runtest_teardown`` below) or at the session's end."""
    try:
        yield SHARED.up()
    finally:
        SHARED.down()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's fixtures are torn down: end Ray when the next test does not use it (the next file's tests, or
    none), so the rest of the suite does not run beside an idle cluster."""
    yield
    if "ray_nodes" in item.fixturenames and (nextitem is None or "ray_nodes" not in nextitem.fixturenames):
        SHARED.down()
