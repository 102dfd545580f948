"""Fixtures for the pod-attribution tests: a short unix-socket path, the pod-resources
stand-in, and the whole kubelet stand-in (device plugin folder and root dir apart)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.sim.kubelet.podresources import PodResourcesServer
from gpuquota.sim.kubelet.registration import KubeletStandIn

NEVER = 3600.0  # a node status sync period no test waits for: syncs are called by hand


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


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """(device-plugin folder, kubelet root dir): two unrelated short folders under /tmp."""
    top = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    plugin_dir, root_dir = top / "dp", top / "root"
    plugin_dir.mkdir()
    root_dir.mkdir()
    yield plugin_dir, root_dir
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def make_kubelet(dirs: tuple[Path, Path]) -> Iterator[Callable[..., KubeletStandIn]]:
    started: list[KubeletStandIn] = []

    def make(**kw: Any) -> KubeletStandIn:
        kw.setdefault("node_status_sync_s", NEVER)
        kubelet = KubeletStandIn(dirs[0], root_dir=dirs[1], **kw)
        kubelet.start()
        started.append(kubelet)
        return kubelet

    yield make
    for kubelet in started:
        kubelet.stop()
