"""Fixtures for the NVML stand-in's tests: the built library, fresh nodes, and pynvml bound
to the stand-in inside this process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from sim.nvml import build
from sim.nvml.control import SimNode, library_path


def _stale(lib: Path) -> bool:
    if not lib.is_file():
        return True
    sources = [*build.CSRC.glob("*.c"), *build.CSRC.glob("*.h"), Path(build.__file__)]
    return max(p.stat().st_mtime for p in sources) > lib.stat().st_mtime


@pytest.fixture(scope="session")
def sim_library() -> Path:
    """The stand-in library, (re)built when missing or older than its sources."""
    lib = library_path()
    if _stale(lib):
        build.build(lib)
    return lib


@pytest.fixture
def make_node(tmp_path: Path, sim_library: Path) -> Iterator[Callable[[Any], SimNode]]:
    nodes: list[SimNode] = []

    def make(spec: Any, name: str = "node.state") -> SimNode:
        node = SimNode.create(tmp_path / name, spec)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


@pytest.fixture
def nvml(make_node: Callable[[Any], SimNode]) -> Iterator[Callable[[Any], SimNode]]:
    """Creates a node and initialises this process's pynvml on it; shuts NVML down after."""
    inited: list[bool] = []

    def start(spec: Any) -> SimNode:
        node = make_node(spec)
        node.preload()
        pynvml.nvmlInit()
        inited.append(True)
        return node

    yield start
    for _ in inited:
        pynvml.nvmlShutdown()


def run_python(node: SimNode, code: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter that finds the stand-in through node.env()."""
    env = {**os.environ, **node.env()}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
