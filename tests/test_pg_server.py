"""The throwaway PostgreSQL server (tests/pg_server.py): runs unprivileged, and goes away."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.pg_server import find_pg_ctl, throwaway_server, unprivileged_account


def test_server_runs_unprivileged_and_is_removed_afterwards() -> None:
    with throwaway_server() as url:
        engine = create_engine(url)
        with engine.connect() as conn:
            data = Path(conn.execute(text("SHOW data_directory")).scalar_one())
            encoding = conn.execute(text("SHOW server_encoding")).scalar_one()
        engine.dispose()
        owner = data.stat().st_uid
        if os.geteuid() == 0:  # as CI runs: the server must not run as root (it refuses to)
            assert owner == unprivileged_account().pw_uid != 0
        else:
            assert owner == os.geteuid()
        assert encoding == "UTF8"
        assert find_pg_ctl().name == "pg_ctl"
    assert not data.exists()
