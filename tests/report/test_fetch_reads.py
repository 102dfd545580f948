"""The report's fetch step: its independent reads run concurrently on PostgreSQL and on a
SQLite file read only (sibling connections of the store's pool), with the same results as one
after another; the BestEffort-pod check reads its partial index, not the window's rows."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.report import allocations
from gpuquota.quota.report.build import run_reads
from gpuquota.quota.report.scope import Scope, gaps
from gpuquota.quota.store import db
from tests.report.conftest import Store, ts

OCT = ts("2026-10-01T00:00:00")
H = 3600


def _who(conn: Connection) -> Any:
    if conn.dialect.name == "postgresql":
        return conn.execute(text("SELECT pg_backend_pid()")).scalar()
    return id(conn)


def _slow_who(conn: Connection) -> Any:
    """Which connection ran this, after 0.3 s of work (the database's own, or a sleep that
    lets go of the interpreter lock as SQLite does)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_sleep(0.3)"))
    else:
        time.sleep(0.3)
    return _who(conn)


def test_reads_share_out_over_connections(store: Store) -> None:
    job = _slow_who

    with db.reading(store.url) as conn:
        began = time.monotonic()
        found = run_reads(conn, {"a": job, "b": job, "c": job, "d": job})
        took = time.monotonic() - began
        me = _who(conn)
    assert sorted(found) == ["a", "b", "c", "d"]
    # three connections (the report's own and two siblings)
    assert len(set(found.values())) == 3 and me in found.values()
    assert took < 1.0, took  # 4 x 0.3 s in two rounds


def test_a_store_that_cannot_read_side_by_side_reads_on_one_connection(store: Store) -> None:
    # the writer's engine of a SQLite file (not the report's read-only one): one connection
    with db.open_store(store.url) as opened, opened.engine.connect() as conn:
        found = run_reads(conn, {"a": _slow_who, "b": _slow_who, "c": _slow_who})
        if store.url.startswith("sqlite"):
            assert set(found.values()) == {_who(conn)}
        else:
            assert len(set(found.values())) == 3


def test_a_failing_read_is_raised_after_the_others_stop(store: Store) -> None:
    ran: list[str] = []

    def bad(conn: Connection) -> Any:
        return conn.execute(text("SELECT no_such_column FROM allocations")).all()

    def good(conn: Connection) -> Any:
        ran.append("good")
        return 1

    with db.reading(store.url) as conn, pytest.raises(SQLAlchemyError, match="no_such_column"):
        run_reads(conn, {"bad": bad, "good": good, "more": good})
    assert len(ran) <= 2


def test_sequential_and_concurrent_reads_agree(store: Store) -> None:
    store.alloc("ml", OCT, OCT + 5 * H, qos_class="BestEffort")
    store.alloc("web", OCT + H, None)
    edges = [OCT, OCT + 31 * 86400]
    now = OCT + 40 * 86400

    def jobs(scope: Scope) -> dict[str, Any]:
        return {
            "usage": lambda c: allocations.usage(c, ["namespace"], edges, now, scope=scope),
            "best_effort": lambda c: allocations.best_effort_pods(
                c, scope, edges[0], edges[1], now
            ),
            "gaps": lambda c: gaps(c, scope.clusters, edges[0], edges[1]),
        }

    with db.reading(store.url) as conn:
        scope = Scope.of(conn, None)
        one = run_reads(conn, jobs(scope), readers=1)
        many = run_reads(conn, jobs(scope), readers=3)
    assert one == many
    assert one["best_effort"] == {"ml": 1}


def test_best_effort_check_reads_its_partial_index(store: Store) -> None:
    store.alloc("ml", OCT, OCT + H, qos_class="BestEffort")
    captured: list[tuple[str, Any]] = []
    with db.reading(store.url) as conn:
        scope = Scope.of(conn, None)
        from sqlalchemy import event

        def capture(*args: Any) -> None:
            captured.append((args[2], args[3]))

        event.listen(conn, "before_cursor_execute", capture)
        allocations.best_effort_pods(conn, scope, OCT, OCT + 86400, OCT + 86400)
        event.remove(conn, "before_cursor_execute", capture)
        (statement, params), *_ = captured
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET enable_seqscan = off"))  # a tiny table: any plan is cheap
            plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {statement}", params))
        else:
            plan = " ".join(
                str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
            )
    assert "ix_allocations_best_effort" in plan, plan


def _count_clusters(conn: Connection) -> Any:
    return conn.execute(text("SELECT count(*) FROM clusters")).scalar()


def test_many_reports_on_one_read_only_connection(store: Store) -> None:
    """A report's reads on reader threads, report after report on one connection (a
    program that makes several, a property test): every read answers. With the pool
    SQLAlchemy picks for a "sqlite://" engine (one connection per thread, closing other
    threads' connections past five threads) the second round already read from closed
    connections ("Cannot operate on a closed database"), or crashed the interpreter."""
    jobs = {name: _count_clusters for name in "abcdef"}
    with db.reading(store.url) as conn:
        for _ in range(12):
            assert run_reads(conn, jobs) == dict.fromkeys(jobs, 0)
