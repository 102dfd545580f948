"""The fleet-wide eviction budget in the store, on SQLite and on a real PostgreSQL: replicas
reserving at the same moment never spend more than the window allows, a crash's reservation
still counts, a PodDisruptionBudget's "not now" gives the place back, and a dry run sharing the
store spends a budget of its own."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuquota.quota.remediation.record import Act, Ledger
from gpuquota.quota.store import db
from tests.conftest import PgSchemas

NOW = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        made = f"sqlite:///{tmp_path / 'gq.db'}"
    else:
        schemas: PgSchemas = request.getfixturevalue("pg_schemas")
        made = schemas.new("remed")
    db.upgrade(made)
    return made


def test_replicas_reserving_at_once_never_overspend(url: str) -> None:
    stores = [db.open_store(url) for _ in range(6)]
    got: list[int | None] = []
    start = threading.Barrier(len(stores))

    def reserve(store: db.Store, n: int) -> None:
        start.wait()
        got.append(Ledger(store, "c").reserve(Act("evict", "evicting", pod=f"p{n}"), NOW, 2, 600))

    try:
        threads = [threading.Thread(target=reserve, args=(s, n)) for n, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(x is not None for x in got) == [False] * 4 + [True] * 2
        ledger = Ledger(stores[0], "c")
        assert ledger.left(NOW, 2, 600) == 0
        assert ledger.left(NOW + 600, 2, 600) == 2  # the window moved on
        assert Ledger(stores[0], "other").left(NOW, 2, 600) == 2  # per cluster
    finally:
        for s in stores:
            s.close()


def test_what_counts_against_the_budget(url: str) -> None:
    with db.open_store(url) as store:
        ledger = Ledger(store, "c")
        first = ledger.reserve(Act("evict", "evicting", pod="a"), NOW, 3, 600)
        assert first is not None
        ledger.finish(first, "blocked_by_pdb")  # the API said not now: free again
        assert ledger.left(NOW, 3, 600) == 3
        second = ledger.reserve(Act("evict", "evicting", pod="b"), NOW, 3, 600)
        assert second is not None
        ledger.discard(second)
        assert ledger.left(NOW, 3, 600) == 3
        for result in ("evicted", "failed"):  # done, or may have been: spent
            row = ledger.reserve(Act("evict", "evicting", pod=result), NOW, 3, 600)
            assert row is not None
            ledger.finish(row, result)
        ledger.reserve(Act("evict", "evicting", pod="crashed"), NOW, 3, 600)  # never finished
        assert ledger.left(NOW, 3, 600) == 0
        ledger.record(Act("condition", "marked", pod="m"), NOW)  # marks are not evictions
        assert ledger.left(NOW + 1, 3, 600) == 0


def test_a_real_instance_and_a_dry_run_each_count_only_their_own_evictions(url: str) -> None:
    """One store, one cluster: a dry run's rows spend its own budget, never the real one."""
    with db.open_store(url) as store:
        ledger = Ledger(store, "c")
        assert ledger.reserve(Act("evict", "dry_run", pod="a"), NOW, 1, 600, dry_run=True)
        assert ledger.left(NOW, 1, 600) == 1  # the preview spent none of the real budget
        assert ledger.reserve(Act("evict", "dry_run", pod="b"), NOW, 1, 600, dry_run=True) is None
        row = ledger.reserve(Act("evict", "evicting", pod="a"), NOW, 1, 600)
        assert row is not None
        ledger.finish(row, "evicted")
        assert ledger.left(NOW, 1, 600) == 0
        assert ledger.left(NOW, 2, 600, dry_run=True) == 1  # nor the real one the preview's
        # a dry run's failed call evicted nothing: it spends neither budget
        failed = ledger.reserve(Act("evict", "dry_run", pod="c"), NOW, 2, 600, dry_run=True)
        assert failed is not None
        ledger.finish(failed, "dry_run_failed")
        assert (ledger.left(NOW, 2, 600, dry_run=True), ledger.left(NOW, 2, 600)) == (1, 1)
