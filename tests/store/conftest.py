"""Fixtures of the store tests: a migrated SQLite file and a migrated PostgreSQL schema.

PostgreSQL schemas come from the shared ``pg_schemas`` fixture (tests/conftest.py). Tests keep
apart from one another by writing under a unique cluster name.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.quota.store import db
from tests.conftest import PgSchemas


@pytest.fixture(scope="session")
def sqlite_session_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'session.db'}"
    db.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A migrated database of either kind, shared within the session (use a unique cluster)."""
    if backend == "sqlite":
        return str(request.getfixturevalue("sqlite_session_url"))
    return str(request.getfixturevalue("pg_session_url"))


@pytest.fixture(scope="session")
def pg_session_url(pg_schemas: PgSchemas) -> str:
    url = pg_schemas.new()
    db.upgrade(url)
    return url


@pytest.fixture
def empty_db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database of either kind with nothing in it (for migrations and the CLI)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    schemas: PgSchemas = request.getfixturevalue("pg_schemas")
    return schemas.new()


@pytest.fixture
def cluster() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(db_url: str) -> Iterator[db.Store]:
    with db.open_store(db_url) as opened:
        yield opened
