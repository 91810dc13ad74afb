"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` + ``pg_ctl`` in a temporary directory.

The server binaries come from Debian's ``postgresql`` package (``/usr/lib/postgresql/<major>/bin``, or wherever
``pg_config --bindir`` says); :func:`ensure_installed` installs the package with apt-get where it is missing (as
the browser tests install Chromium). ``initdb`` refuses to run as root, so as root the cluster is created and run
by an unprivileged user: ``postgres`` (the package's) if it exists, else ``nobody``. The server listens on loopback
on a free port, trusts local connections (nothing else can reach it) and is stopped and removed on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

DATABASE = "turncache"
USER = "turncache"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here, and they could not be installed; the message says why."""


def bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, if any."""
    candidates = []
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)  # newest major first
    if shutil.which("initdb"):
        candidates.append(str(Path(shutil.which("initdb")).resolve().parent))
    for found in candidates:
        path = Path(found)
        if all((path / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return path
    return None


def ensure_installed() -> Path:
    """The server binaries' directory, installing Debian's ``postgresql`` package first if they are missing.

    Raises:
        PostgresUnavailable: they are missing and apt-get is not there, or failed (its error is quoted).
    """
    found = bindir()
    if found is not None:
        return found
    if shutil.which("apt-get") is None:
        raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresUnavailable(f"{' '.join(cmd)} failed: {exc}") from exc
        if done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    found = bindir()
    if found is None:
        raise PostgresUnavailable("apt-get install postgresql did not provide initdb and pg_ctl")
    return found


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runner() -> tuple[dict, str | None]:
    """subprocess keyword arguments that run as an unprivileged user when we are root, and that user's name."""
    if os.geteuid() != 0:
        return {}, None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}, name
    raise PostgresUnavailable("running as root, and neither the user 'postgres' nor 'nobody' exists to run initdb")


@contextlib.contextmanager
def local_postgres(*, install: bool = True) -> Iterator[str]:
    """A fresh server with an empty database; yields its URL (``postgresql://turncache@127.0.0.1:PORT/turncache``).

    Raises:
        PostgresUnavailable: no server binaries (see :func:`ensure_installed`), or the server did not start (its log
            is quoted).
    """
    tools = ensure_installed() if install else bindir()
    if tools is None:
        raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl)")
    as_user, name = _runner()
    root = Path(tempfile.mkdtemp(prefix="turncache-pg-"))
    data, log = root / "data", root / "server.log"
    try:
        if name is not None:
            entry = pwd.getpwnam(name)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        run = dict(capture_output=True, text=True, timeout=120, env=env, cwd=root, **as_user)
        done = subprocess.run(
            [str(tools / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=False,
            **run,
        )
        if done.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {done.stderr.strip()[-800:]}")
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} -c fsync=off"
        done = subprocess.run(
            [str(tools / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"],
            check=False,
            **run,
        )
        if done.returncode != 0:
            text = log.read_text(errors="replace")[-800:] if log.exists() else done.stderr
            raise PostgresUnavailable(f"the PostgreSQL server did not start: {text.strip()}")
        try:
            import psycopg

            with psycopg.connect(f"postgresql://{USER}@127.0.0.1:{port}/postgres", autocommit=True) as db:
                db.execute(f"CREATE DATABASE {DATABASE}")
            yield f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"
        finally:
            subprocess.run(
                [str(tools / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], check=False, **run
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
