"""Fixtures of the store tests: a migrated SQLite file and a migrated PostgreSQL schema.

The PostgreSQL server is shared with other test areas, so this session works in its own
uniquely named schema (selected through libpq's ``options=-csearch_path=...`` in the URL,
which every connection of the code under test inherits) and drops it at the end. Tests keep
apart from one another by writing under a unique cluster name.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text

from quota.store import db


def schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"


class PgSchemas:
    """Creates uniquely named schemas on the test server and drops them all at the end."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.engine = create_engine(base_url)
        self.created: list[str] = []

    def new(self) -> str:
        name = f"gq_store_{uuid.uuid4().hex[:12]}"
        with self.engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        self.created.append(name)
        return schema_url(self.base_url, name)

    def drop_all(self) -> None:
        with self.engine.begin() as conn:
            for name in self.created:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        self.engine.dispose()


@pytest.fixture(scope="session")
def pg_schemas(postgres_url: str) -> Iterator[PgSchemas]:
    try:
        schemas = PgSchemas(postgres_url)
        with schemas.engine.connect():
            pass
    except Exception as exc:  # the suite needs the real server: say which one is missing
        pytest.fail(f"PostgreSQL at {db.safe_url(postgres_url)} is not reachable: {exc}")
    yield schemas
    schemas.drop_all()


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
