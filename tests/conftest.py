"""Fixtures shared by every test area; each area keeps its own in tests/<area>/conftest.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text

from gpuquota.quota.store import db
from gpuquota.sim.nvml import build
from gpuquota.sim.nvml.control import SimNode, library_path
from tests.noskip import pytest_runtest_makereport  # noqa: F401  (a hook: skips fail)
from tests.pg_server import throwaway_server

# The venv's own tools (kubectl, ruff, the project's entry points) come first, also when the
# tests run as `.venv/bin/python -m pytest` without the venv activated.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# The NVML stand-in costs what a real H100 costs (sim/nvml/costs.py); most tests want it
# instant so the suite stays fast. A test that needs the costs says so in its node spec
# (nvml_costs: {mode: modelled}), which wins over this. Set before any library is loaded.
os.environ.setdefault("GPUQUOTA_SIM_NVML_COSTS", "instant")


# --- parallel workers (pytest-xdist: `-n 2 --dist loadfile` in pyproject.toml) -----------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: modules with a test marked slow come first (order kept within each).

    With ``--dist loadfile --no-loadscope-reorder`` a module is one unit of work, handed out in
    this order, so a minutes-long module (the demo, the wheel, the FOCUS validator) starts at
    once instead of last, leaving the other worker idle meanwhile. A serial run (``-n 0``)
    keeps the plain order."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.nodeid.partition("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.partition("::")[0] not in slow)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of the real PostgreSQL server the tests use.

    GPUQUOTA_TEST_PG_URL names one; without it the session starts its own throwaway server
    (tests/pg_server.py), so a fresh machine needs no database server running."""
    named = os.environ.get("GPUQUOTA_TEST_PG_URL")
    if named:
        yield named
        return
    with throwaway_server() as url:
        yield url


class PgSchemas:
    """Uniquely named schemas on the shared PostgreSQL server, dropped at the session's end.

    Other test areas (and other checkouts) use the same server at the same time, so each works
    in its own schema, selected through libpq's ``options=-csearch_path=...`` in the URL, which
    every connection of the code under test inherits."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.engine = create_engine(base_url)
        self.created: list[str] = []

    def new(self, prefix: str = "gq") -> str:
        """A fresh empty schema; returns the URL whose connections use it."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with self.engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        self.created.append(name)
        sep = "&" if "?" in self.base_url else "?"
        return f"{self.base_url}{sep}options={quote(f'-csearch_path={name}')}"

    def drop_all(self) -> None:
        with self.engine.begin() as conn:
            for name in self.created:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        self.engine.dispose()


@pytest.fixture(scope="session")
def pg_schemas(postgres_url: str) -> Iterator[PgSchemas]:
    """The real PostgreSQL server is a required part of the suite: unreachable fails, never skips."""
    schemas = PgSchemas(postgres_url)
    try:
        with schemas.engine.connect():
            pass
    except Exception as exc:
        pytest.fail(
            f"PostgreSQL at {db.safe_url(postgres_url)} is not reachable ({exc}); "
            "set GPUQUOTA_TEST_PG_URL to point the tests at another server"
        )
    yield schemas
    schemas.drop_all()


# --- the NVML stand-in, shared by every area that drives a simulated node ----------------------

SIM_BUILD_LOCK = Path("/tmp/gpuquota-sim-build.lock")


@pytest.fixture(scope="session")
def sim_library() -> Path:
    """The NVML stand-in library, (re)built when missing or older than its sources."""
    lib = library_path()
    sources = [*build.CSRC.glob("*.c"), *build.CSRC.glob("*.h"), Path(build.__file__)]
    with SIM_BUILD_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test runs may build at once
        if not lib.is_file() or max(p.stat().st_mtime for p in sources) > lib.stat().st_mtime:
            build.build(lib)
    return lib


@pytest.fixture
def sim_dir() -> Iterator[Path]:
    """A short private folder under /tmp (unix socket paths are limited to 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gq-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_node(sim_dir: Path, sim_library: Path) -> Iterator[Callable[..., SimNode]]:
    """make_node(spec) -> a fresh SimNode in a private state file, closed after the test."""
    nodes: list[SimNode] = []

    def make(spec: Any, name: str = "node.state") -> SimNode:
        node = SimNode.create(sim_dir / name, spec)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()
