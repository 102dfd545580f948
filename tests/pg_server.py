"""A throwaway PostgreSQL server for one test session, started with pytest-postgresql.

The suite needs a real PostgreSQL but must pass on a fresh machine where none runs, so unless
GPUQUOTA_TEST_PG_URL names a server the tests start their own from Debian's server binaries
(/usr/lib/postgresql/<version>/bin) on a free port, with trust auth, and remove it at the end.

PostgreSQL refuses to run as root, and CI runs as root. As root the server's pg_ctl is
therefore run through a two-line wrapper that drops to an unprivileged account with util-linux's
``setpriv`` (always present on Debian, unlike sudo): ``postgres`` when Debian's postgresql-common
created it, else ``nobody``. The data directory, socket and log live in a private folder under
/tmp owned by that account (pytest's own temporary folders are root-only, mode 0700, which is
why this uses pytest-postgresql's executor rather than its ``postgresql_proc`` fixture factory,
whose data directory lives there).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import port_for
import psycopg
from pytest_postgresql.executors import PostgreSQLExecutor

INSTALL_HINT = "apt-get install -y postgresql (or run `make test` as root, which installs it)"


def find_pg_ctl() -> Path:
    """The newest Debian PostgreSQL server's pg_ctl, else the one on PATH."""
    candidates = Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")
    versioned = sorted(candidates, key=lambda p: [int(n) for n in re.findall(r"\d+", p.parts[-3])])
    if versioned:
        return versioned[-1]
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path)
    raise FileNotFoundError(
        f"no PostgreSQL server binaries (pg_ctl) found in /usr/lib/postgresql/*/bin or on PATH: "
        f"{INSTALL_HINT}; or set GPUQUOTA_TEST_PG_URL to use a running server"
    )


def unprivileged_account() -> pwd.struct_passwd:
    """The account a root test run starts the server as."""
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise LookupError("neither a 'postgres' nor a 'nobody' account exists to run PostgreSQL as")


def as_account_wrapper(pg_ctl: Path, account: pwd.struct_passwd, folder: Path) -> Path:
    """A pg_ctl stand-in script that runs the real one as ``account``."""
    wrapper = folder / "pg_ctl"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# run from / so the server never depends on the caller's folder being readable\n"
        f"cd / && exec setpriv --reuid={account.pw_uid} --regid={account.pw_gid} "
        f'--init-groups "{pg_ctl}" "$@"\n'
    )
    wrapper.chmod(stat.S_IRWXU)
    return wrapper


@contextmanager
def throwaway_server() -> Iterator[str]:
    """Start a private PostgreSQL; yields its SQLAlchemy URL, stops and deletes it on exit."""
    pg_ctl = find_pg_ctl()
    folder = Path(tempfile.mkdtemp(prefix="gq-pg-", dir="/tmp"))
    try:
        executable = pg_ctl
        if os.geteuid() == 0:
            account = unprivileged_account()
            os.chown(folder, account.pw_uid, account.pw_gid)
            wrapper_dir = Path(tempfile.mkdtemp(prefix="gq-pgctl-", dir="/tmp"))
            executable = as_account_wrapper(pg_ctl, account, wrapper_dir)
        server, port = _start(executable, folder)
        try:
            server.wait_for_postgres()
            accepting(port)
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if executable != pg_ctl:
            shutil.rmtree(executable.parent, ignore_errors=True)


def accepting(port: int, seconds: float = 60.0) -> None:
    """Wait until the server answers a query: ``pg_ctl -w`` and the executor's wait can
    return while it still says "the database system is starting up" (seen under load)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with psycopg.connect(
                host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=5
            ) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _start(executable: Path, folder: Path, attempts: int = 3) -> tuple[PostgreSQLExecutor, int]:
    """A started server on a free port. A port found free can be taken before the server binds
    it (the other test worker starts its own server at the same time): then another port, in
    a data directory of its own."""
    attempt = 1
    while True:
        port = port_for.select_random()
        server = PostgreSQLExecutor(
            executable=str(executable),
            host="127.0.0.1",
            port=port,
            datadir=str(folder / f"data-{attempt}"),
            unixsocketdir=str(folder),
            logfile=str(folder / f"server-{attempt}.log"),
            startparams="-w",
            dbname="postgres",
            user="postgres",
            # fsync off: a throwaway server loses nothing worth keeping on a crash
            postgres_options="-c fsync=off -c full_page_writes=off -c max_connections=200",
        )
        try:
            server.start()
            return server, port
        except Exception:
            with contextlib.suppress(Exception):  # nothing may be running to stop
                server.stop()
            if attempt == attempts:
                raise
            attempt += 1
