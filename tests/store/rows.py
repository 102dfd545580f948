"""Read back what the store holds for one cluster, as comparable plain values."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import (
    Allocation,
    ClaimAllocation,
    Heartbeat,
    NamespaceLabels,
    NodeCapacity,
    QuotaSample,
)


def _select(store: Store, model: Any, cluster: str, order: list[str]) -> list[dict[str, Any]]:
    table = model.__table__
    stmt = select(table).where(table.c.cluster == cluster).order_by(*(table.c[c] for c in order))
    with store.engine.connect() as conn:
        return [
            {k: v for k, v in row._mapping.items() if k not in ("id", "cluster")}
            for row in conn.execute(stmt)
        ]


def allocations(store: Store, cluster: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (r["pod_uid"], r["resource_name"]): r
        for r in _select(store, Allocation, cluster, ["pod_uid", "resource_name"])
    }


def claim_allocations(store: Store, cluster: str) -> list[dict[str, Any]]:
    return _select(store, ClaimAllocation, cluster, ["claim_uid", "pod_uid", "resource_name"])


def capacity(store: Store, cluster: str) -> list[dict[str, Any]]:
    return _select(store, NodeCapacity, cluster, ["node", "resource_name", "started_at"])


def labels(store: Store, cluster: str) -> list[dict[str, Any]]:
    return _select(store, NamespaceLabels, cluster, ["namespace", "valid_from"])


def samples(store: Store, cluster: str) -> list[dict[str, Any]]:
    return _select(
        store, QuotaSample, cluster, ["namespace", "quota_name", "resource_name", "observed_at"]
    )


def heartbeat(store: Store, cluster: str) -> list[dict[str, Any]]:
    return _select(store, Heartbeat, cluster, ["at"])


def everything(store: Store, cluster: str, *, without_updated_at: bool = False) -> dict[str, Any]:
    allocs = allocations(store, cluster)
    if without_updated_at:
        allocs = {k: {n: v for n, v in r.items() if n != "updated_at"} for k, r in allocs.items()}
    return {
        "allocations": allocs,
        "capacity": capacity(store, cluster),
        "labels": labels(store, cluster),
        "samples": samples(store, cluster),
        "claims": claim_allocations(store, cluster),
    }
