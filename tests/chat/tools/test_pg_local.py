"""chat/tools/pg_local.py: where the PostgreSQL server binaries are found, the clear error when they are missing and
cannot be installed, the unprivileged user that runs them as root, and one throwaway server started and removed."""

import contextlib
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from chat.tools import pg_local
from chat.tools.pg_local import PostgresUnavailable, bindir, ensure_installed, local_postgres


def _tools(folder: Path, names=("initdb", "pg_ctl", "postgres")) -> Path:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).touch()
    return folder


def test_the_binaries_are_the_newest_major_folder_that_holds_all_three(monkeypatch, tmp_path):
    old, incomplete = _tools(tmp_path / "14" / "bin"), _tools(tmp_path / "16" / "bin", ("initdb", "pg_ctl"))
    newest = _tools(tmp_path / "15" / "bin")
    monkeypatch.setattr(pg_local.shutil, "which", lambda name: None)  # no pg_config, no initdb on the PATH
    monkeypatch.setattr(pg_local.glob, "glob", lambda pattern: [str(old), str(incomplete), str(newest)])
    assert bindir() == newest
    monkeypatch.setattr(pg_local.glob, "glob", lambda pattern: [str(incomplete)])
    assert bindir() is None


def test_initdb_on_the_path_is_found_too(monkeypatch, tmp_path):
    folder = _tools(tmp_path / "bin")
    monkeypatch.setattr(pg_local.shutil, "which", lambda name: str(folder / name) if name == "initdb" else None)
    monkeypatch.setattr(pg_local.glob, "glob", lambda pattern: [])
    assert bindir() == folder


def test_missing_binaries_without_apt_get_are_a_clear_error_and_found_ones_are_used_as_they_are(monkeypatch, tmp_path):
    monkeypatch.setattr(pg_local, "bindir", lambda: None)
    monkeypatch.setattr(pg_local.shutil, "which", lambda name: None)
    with pytest.raises(PostgresUnavailable, match="no apt-get to install them"):
        ensure_installed()
    refused = pytest.raises(PostgresUnavailable, match=r"no PostgreSQL server binaries \(initdb, pg_ctl\)")
    with refused, local_postgres(install=False):
        pytest.fail("a server without binaries")
    monkeypatch.setattr(pg_local, "bindir", lambda: tmp_path)
    monkeypatch.setattr(pg_local.subprocess, "run", lambda *a, **k: pytest.fail("apt-get was run"))
    assert ensure_installed() == tmp_path


def test_as_root_the_server_runs_as_postgres_or_else_nobody(monkeypatch):
    users = {"nobody": SimpleNamespace(pw_uid=65534, pw_gid=65534)}
    monkeypatch.setattr(pg_local.pwd, "getpwnam", lambda name: users[name])
    monkeypatch.setattr(pg_local.os, "geteuid", lambda: 0)
    assert pg_local._runner() == ({"user": 65534, "group": 65534, "extra_groups": []}, "nobody")
    users["postgres"] = SimpleNamespace(pw_uid=110, pw_gid=120)
    assert pg_local._runner()[1] == "postgres"
    users.clear()
    with pytest.raises(PostgresUnavailable, match="neither the user 'postgres' nor 'nobody'"):
        pg_local._runner()
    monkeypatch.setattr(pg_local.os, "geteuid", lambda: 1000)
    assert pg_local._runner() == ({}, None)  # not root: as ourselves


def test_a_throwaway_server_serves_an_empty_database_and_is_gone_afterwards(monkeypatch):
    import psycopg

    made, mkdtemp = [], pg_local.tempfile.mkdtemp
    monkeypatch.setattr(pg_local.tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    with local_postgres() as url:  # installs the binaries where they are missing, as the postgres_server fixture
        assert url.startswith("postgresql://turncache@127.0.0.1:") and url.endswith("/turncache")
        with psycopg.connect(url) as db:
            query = "SELECT current_database(), count(*) FROM pg_tables WHERE schemaname = 'public'"
            assert db.execute(query).fetchone() == ("turncache", 0)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
    with contextlib.closing(socket.socket()) as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # stopped
    assert len(made) == 1 and not Path(made[0]).exists()  # its data directory removed
