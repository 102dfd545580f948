"""The remediation tests' simulated cluster, one per test (tests/remediation/cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.sim.apiserver import ApiServer
from tests.remediation.cluster import Cluster, make_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ApiServer() as server:
        made = make_cluster(server, tmp_path)
        try:
            yield made
        finally:
            made.close()
