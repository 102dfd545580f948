"""Fixtures: a short device plugin folder and the kubelet stand-in serving kubelet.sock in it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.sim.kubelet.registration import KubeletStandIn


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes: keep them short, under /tmp.
    folder = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(plugin_dir)
    stand_in.start()
    yield stand_in
    stand_in.stop()
