"""Fixtures of the fleet history tests: the ledger tests' migrated stores of either kind and
unique clusters (tests/ledger/conftest.py), and one real Prometheus serving the scenario's
samples (tests/fleet/scenario.py), shared by the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import scenario
from tests.ledger.conftest import cluster, db_url, ledger_pg_url, ledger_sqlite_url, work
from tests.prometheus import Prometheus, create_blocks, serving

__all__ = ["cluster", "db_url", "ledger_pg_url", "ledger_sqlite_url", "work"]


@pytest.fixture(scope="session")
def fleet_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("fleet")
    tsdb = work / "tsdb"
    create_blocks(scenario.openmetrics(), tsdb, work)
    with serving(tsdb, Path(work)) as prometheus:
        yield prometheus
