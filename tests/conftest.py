"""Fixtures shared by every test area; each area keeps its own in tests/<area>/conftest.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.nvml import build
from sim.nvml.control import SimNode, library_path

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the real PostgreSQL server the tests use (GPUQUOTA_TEST_PG_URL overrides)."""
    return os.environ.get("GPUQUOTA_TEST_PG_URL", DEFAULT_PG_URL)


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
