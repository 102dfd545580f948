"""Fixtures shared by every test area; each area keeps its own in tests/<area>/conftest.py."""

from __future__ import annotations

import os

import pytest

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the real PostgreSQL server the tests use (GPUQUOTA_TEST_PG_URL overrides)."""
    return os.environ.get("GPUQUOTA_TEST_PG_URL", DEFAULT_PG_URL)
