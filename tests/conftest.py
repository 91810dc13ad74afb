import pytest
import torch

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
