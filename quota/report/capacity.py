"""The idle table's read: allocatable GPU-seconds of the GPU nodes (``node_capacity`` history) per
cluster, model, pool and sub-window. The pure side (allocatable minus allocated, covered time
only) is quota/report/idle.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.engine import Connection

from gpuquota.quota.report.scope import Scope
from gpuquota.quota.report.sql import clipped
from gpuquota.quota.store.models import NodeCapacity


@dataclass(frozen=True)
class CapacityRow:
    gpu_model: str | None
    node_pool: str | None
    resource_name: str
    allocatable_units: int
    physical_gpus: float
    seconds: tuple[int, ...]  # per sub-window
    share: Fraction = Fraction(1)  # the exact physical share of one unit, as stored
    cluster: str | None = None  # None: not told apart (every sub-window counts as covered)


def capacity(
    conn: Connection,
    edges: Sequence[int],
    now: int,
    cluster: str | None = None,
    scope: Scope | None = None,
) -> list[CapacityRow]:
    """Allocatable GPU seconds of GPU nodes per cluster, model, pool and sub-window."""
    c = NodeCapacity
    scope = scope or Scope.of(conn, cluster)
    end: Any = func.coalesce(c.ended_at, scope.open_end(c.cluster, now))
    lo, hi = edges[0], min(edges[-1], now)
    windows = [
        func.sum(clipped(c.started_at, end, b0, min(b1, now)))
        for b0, b1 in itertools.pairwise(edges)
    ]
    group: list[Any] = [
        c.gpu_model,
        c.node_pool,
        c.resource_name,
        c.allocatable_units,
        c.physical_gpus,
        c.share_numerator,
        c.share_denominator,
        c.cluster,
    ]
    stmt = select(*group, *windows).where(
        c.started_at < hi, or_(c.ended_at > lo, c.ended_at.is_(None))
    )
    if cluster is not None:
        stmt = stmt.where(c.cluster == cluster)
    n = len(edges) - 1
    return [
        CapacityRow(
            r[0],
            r[1],
            r[2],
            int(r[3]),
            float(r[4]),
            tuple(int(s or 0) for s in r[8 : 8 + n]),
            Fraction(int(r[5]), int(r[6])),
            str(r[7]),
        )
        for r in conn.execute(stmt.group_by(*group))
    ]
