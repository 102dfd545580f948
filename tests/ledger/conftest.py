"""Fixtures of the ledger tests: a migrated store of either kind, a unique cluster, and a real
Prometheus serving samples written with their own timestamps (tests/prometheus.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gpuquota.quota.store import db
from tests.conftest import PgSchemas


@pytest.fixture(scope="session")
def ledger_sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"
    db.upgrade(url)
    return url


@pytest.fixture(scope="session")
def ledger_pg_url(pg_schemas: PgSchemas) -> str:
    url = pg_schemas.new("ledger")
    db.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated store of either kind, shared by the session (tests use unique clusters)."""
    name = "ledger_sqlite_url" if request.param == "sqlite" else "ledger_pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def cluster() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path
