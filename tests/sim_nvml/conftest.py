"""Fixtures for the NVML stand-in's tests: the built library, fresh nodes, and pynvml bound
to the stand-in inside this process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from gpuquota.sim.nvml.control import SimNode


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
