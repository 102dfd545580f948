"""The ledger's devices (usage_devices, migration 0010): one row per device however many series
it has, its node, GPU model and MIG profile the last seen (a model from the samples over one
from an allocation), written only when they change; series keyed by the device's row."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select, text

from gpuquota.quota.accounting.rows import Batch
from gpuquota.quota.ledger.source import SeriesSamples
from gpuquota.quota.ledger.write import LedgerStore
from gpuquota.quota.store.db import Store, open_store
from gpuquota.quota.store.models import UsageDevice, UsageSeries
from tests.ledger.test_ingest import _allocation

GPU = "GPU-2b5b9a54-7c5e-4f0e-9d36-0d6f3c1f7a01"
MIG = "MIG-6e1d0c6a-3f3b-5a8e-b1f1-7f5d2a9c4e02"
NVML = "NVIDIA H100 80GB HBM3"


def _ids(store: Store, cluster: str, series: list[SeriesSamples]) -> dict[Any, int]:
    with store.engine.begin() as conn:
        return LedgerStore(store, cluster).series_ids(conn, series)


def _devices(store: Store, cluster: str) -> dict[str, tuple[Any, ...]]:
    d = UsageDevice.__table__
    with store.engine.connect() as conn:
        rows = conn.execute(select(d).where(d.c.cluster == cluster)).all()
    return {r.device_uuid: (r.id, r.node, r.gpu_model, r.mig_profile) for r in rows}


def test_devices_once_with_their_last_labels(db_url: str, cluster: str) -> None:
    store = open_store(db_url)
    try:
        store.write(cluster, Batch(allocations=[_allocation("u2", "p2", "ns", 1.0, 0)]))
        idle = SeriesSamples(GPU, "unallocated", "", node="node-1", gpu_model=NVML)
        p1 = SeriesSamples(GPU, "pod", "u1", "ns", "p1", node="node-1", activity="sm_active")
        p2 = SeriesSamples(MIG, "pod", "u2", "ns", "p2", node="node-2", mig_profile="3g.40gb")
        first = _ids(store, cluster, [idle, p1, p2])
        assert set(first) == {idle.key, p1.key, p2.key} and len(set(first.values())) == 3
        devices = _devices(store, cluster)
        # the MIG device's model: its samples name none, the allocation of its pod does
        assert devices == {
            GPU: (devices[GPU][0], "node-1", NVML, None),
            MIG: (devices[MIG][0], "node-2", "H100", "3g.40gb"),
        }
        s = UsageSeries.__table__
        with store.engine.connect() as conn:
            keyed = {
                (r.device_id, r.holder_uid): r.id
                for r in conn.execute(select(s).where(s.c.cluster == cluster))
            }
        assert keyed == {
            (devices[GPU][0], ""): first[idle.key],
            (devices[GPU][0], "u1"): first[p1.key],
            (devices[MIG][0], "u2"): first[p2.key],
        }
        # again, labels unknown now: the same ids, nothing forgotten
        blank = [replace(x, node=None, gpu_model=None, mig_profile=None) for x in (idle, p1, p2)]
        assert _ids(store, cluster, blank) == first
        assert _devices(store, cluster) == devices
        # a pod on the GPU whose samples name no model: its allocation's model does not
        # replace the name the samples gave (node labels name it otherwise)
        store.write(cluster, Batch(allocations=[_allocation("u3", "p3", "ns", 1.0, 0)]))
        p3 = SeriesSamples(GPU, "pod", "u3", "ns", "p3", node="node-1")
        assert _ids(store, cluster, [p3])[p3.key] not in first.values()
        assert _devices(store, cluster)[GPU][2] == NVML
        # the last seen wins: the node moved, the samples name another model
        moved = [replace(p1, node="node-9", gpu_model="NVIDIA H200")]
        assert _ids(store, cluster, moved) == {p1.key: first[p1.key]}
        assert _devices(store, cluster)[GPU] == (devices[GPU][0], "node-9", "NVIDIA H200", None)
        # the same UUID in another cluster is another device
        other = f"{cluster}-b"
        _ids(store, other, [idle])
        assert _devices(store, other)[GPU][0] != devices[GPU][0]
    finally:
        store.close()


def test_an_unchanged_device_is_not_written_again(ledger_pg_url: str, cluster: str) -> None:
    """On PostgreSQL, whose row versions (xmin) show a write."""
    store = open_store(ledger_pg_url)
    version = text("SELECT xmin::text FROM usage_devices WHERE cluster = :c")
    try:
        idle = SeriesSamples(GPU, "unallocated", "", node="node-1", gpu_model=NVML)
        _ids(store, cluster, [idle])
        with store.engine.connect() as conn:
            before = conn.execute(version, {"c": cluster}).scalar_one()
        held = SeriesSamples(GPU, "pod", "u1", "ns", "p1", gpu_model=NVML)
        _ids(store, cluster, [idle, held])  # every window sees it, its labels unchanged
        with store.engine.connect() as conn:
            assert conn.execute(version, {"c": cluster}).scalar_one() == before
        _ids(store, cluster, [replace(idle, node="node-2")])
        with store.engine.connect() as conn:
            assert conn.execute(version, {"c": cluster}).scalar_one() != before
    finally:
        store.close()


def test_an_unchanged_series_is_not_written_again(ledger_pg_url: str, cluster: str) -> None:
    """On PostgreSQL (row versions, xmin): a series seen again with the same labels keeps its
    row version; a changed name or activity writes."""
    store = open_store(ledger_pg_url)
    version = text("SELECT xmin::text FROM usage_series WHERE cluster = :c AND holder_uid = 'u1'")
    try:
        p1 = SeriesSamples(GPU, "pod", "u1", "ns", "p1", node="node-1", activity="sm_active")
        _ids(store, cluster, [p1])
        with store.engine.connect() as conn:
            before = conn.execute(version, {"c": cluster}).scalar_one()
        _ids(store, cluster, [p1])
        _ids(store, cluster, [replace(p1, activity=None)])  # unknown now: kept, not written
        with store.engine.connect() as conn:
            assert conn.execute(version, {"c": cluster}).scalar_one() == before
        _ids(store, cluster, [replace(p1, activity="utilization")])
        with store.engine.connect() as conn:
            assert conn.execute(version, {"c": cluster}).scalar_one() != before
            s = UsageSeries.__table__
            got = conn.execute(select(s.c.activity).where(s.c.cluster == cluster)).scalar_one()
        assert got == "utilization"
    finally:
        store.close()
