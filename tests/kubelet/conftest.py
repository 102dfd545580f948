"""Fixtures for the pod-attribution tests: a short unix-socket path and the kubelet stand-in."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.sim.kubelet.podresources import PodResourcesServer


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes: keep them short, under /tmp.
    folder = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))
    yield folder / "kubelet.sock"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def kubelet(socket_path: Path) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(socket_path) as server:
        yield server
