"""`gpuquota db prune` beside a ledger write in flight (PostgreSQL): prune must not remove a
device or series that the write, still uncommitted when prune looked, has just given a new
window; else the new rows would refer to ids that no longer exist and the report would drop
them (nothing may be lost, whatever runs at the same time)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import insert, select, text

from gpuquota.quota.ledger.source import SeriesSamples
from gpuquota.quota.ledger.write import LedgerStore
from gpuquota.quota.store import db
from gpuquota.quota.store.daytwo import prune
from gpuquota.quota.store.models import UsageDevice, UsageSeries, UsageWindow

START = 1767225600  # 2026-01-01T00:00:00Z
HOUR = 3600


def _window(series_id: int, start: int) -> dict[str, Any]:
    return {
        "series_id": series_id,
        "window_start": start,
        "window_seconds": HOUR,
        "used_gpu_seconds": 1.0,
        "energy_joules": 2.0,
        "sampled_seconds": 3600.0,
        "end_used": 1.0,
        "end_energy": 2.0,
    }


@pytest.mark.postgres
def test_prune_waits_for_a_ledger_write_in_flight(pg_schemas: Any) -> None:
    url = pg_schemas.new("prune")
    db.upgrade(url)
    store = db.open_store(url)
    try:
        # GPU-1's only holder stopped counting before the cut-off: prune would take its window,
        # its series and the device
        with store.engine.begin() as conn:
            device = conn.execute(
                insert(UsageDevice).returning(UsageDevice.id),
                {"cluster": "c", "device_uuid": "GPU-1"},
            ).scalar_one()
            old = conn.execute(
                insert(UsageSeries).returning(UsageSeries.id),
                {"device_id": device, "cluster": "c", "holder_kind": "pod",
                 "holder_uid": "uid-old", "namespace": "ns", "holder_name": "old"},
            ).scalar_one()  # fmt: skip
            conn.execute(insert(UsageWindow), _window(old, START))
        # the ingester's transaction: the GPU counts again, for a new pod, not yet committed
        writer = LedgerStore(store, "c")
        conn = store.engine.connect()
        transaction = conn.begin()
        new = SeriesSamples("GPU-1", "pod", "uid-new", namespace="ns", holder_name="new")
        ids = writer.series_ids(conn, [new])
        conn.execute(insert(UsageWindow), _window(ids[new.key], START + 3 * HOUR))
        pruned: list[Any] = []
        pruning = threading.Thread(
            target=lambda: pruned.append(prune(url, START + 2 * HOUR, apply=True))
        )
        pruning.start()
        # commit only once prune waits on the write's locks (else the race is not run)
        deadline = time.monotonic() + 60
        with store.engine.connect() as watch:
            while not watch.execute(
                text("SELECT count(*) FROM pg_locks WHERE NOT granted")
            ).scalar_one():
                assert time.monotonic() < deadline, "prune never waited on the write"
                assert pruning.is_alive(), "prune ended without waiting on the write"
                time.sleep(0.05)
        transaction.commit()
        conn.close()
        pruning.join(60)
        assert pruned, "prune did not finish"
        with store.engine.connect() as check:
            devices = set(check.execute(select(UsageDevice.id)).scalars())
            series = {
                row.holder_uid: row.device_id
                for row in check.execute(select(UsageSeries.holder_uid, UsageSeries.device_id))
            }
            windows = set(check.execute(select(UsageWindow.series_id)).scalars())
        assert set(series) == {"uid-new"}  # the old holder went
        assert series["uid-new"] == device in devices  # the device the new one counts on stays
        assert windows == {ids[new.key]}
    finally:
        store.close()
