import pytest
import torch

# Test files that start a Ray cluster: run on one xdist worker, one after the other, each in file order (two clusters
# at once on 2 cores starve each other's raylets; the files' tests share a module fixture and rely on their order).
ONE_WORKER_FILES = ("tests/chat/cluster/test_live.py", "tests/chat/cluster/test_live_ingresses.py")
# Test files run whole on one worker, each a unit of its own: their module fixtures load a real model (Gemma 3 270M,
# ~8 s, and again with a chat template) that every worker running one of their tests would load again.
WHOLE_FILES = ("tests/chat/models/test_gemma3_270m.py",)

# Two threads on a busy 2-core machine can be 100x slower per small op (see ../shared/DESIGN.md).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the whole run (chat/tools/pg_local.py): Debian's package is installed where
    it is missing. Never skipped: without a server the tests that need one fail, saying why."""
    from chat.tools.pg_local import PostgresUnavailable, local_postgres

    try:
        with local_postgres() as url:
            yield url
    except PostgresUnavailable as exc:
        pytest.fail(f"the PostgreSQL tests need a PostgreSQL server: {exc}", pytrace=False)


@pytest.fixture
def postgres_url(postgres_server):
    """The server's database, emptied for this test (every table dropped)."""
    import psycopg

    with psycopg.connect(postgres_server, autocommit=True) as db:
        db.execute("DROP SCHEMA public CASCADE")
        db.execute("CREATE SCHEMA public")
    return postgres_server


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (a dev dependency): unknown without it
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s scheduler under pytest-xdist: xdist's ``load`` (each test its own unit) but the
    ``ONE_WORKER_FILES`` as one unit and each of the ``WHOLE_FILES`` as one. xdist's scope scheduler sends the units
    with the most tests first, so these start at once, one per worker, while the single tests fill in around them.
    (xdist's own ``--dist loadgroup`` reads a node id suffix that pytest 9 no longer lets it set: its
    ``xdist_group`` marks are ignored there.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerForRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            if file in ONE_WORKER_FILES:
                return "one-worker"
            return file if file in WHOLE_FILES else nodeid

    return OneWorkerForRay(config, log)
