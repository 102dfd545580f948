"""The throwaway PostgreSQL server (tests/pg_server.py): runs unprivileged, and goes away."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import port_for
import pytest
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


def test_a_port_taken_before_the_server_binds_it_means_another_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other test worker (or anything else) can take the port picked as free before the
    server binds it: the server starts on another one."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    picks = iter([busy])
    real = port_for.select_random
    monkeypatch.setattr(port_for, "select_random", lambda *a, **k: next(picks, None) or real())
    try:
        with throwaway_server() as url:
            assert f":{busy}/" not in url
            engine = create_engine(url)
            with engine.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar_one() == 1
            engine.dispose()
    finally:
        taken.close()
