"""What the store knows of each cluster, and which allocation rows a window can touch: the
clusters, where each one's data begins and ends (its clusters row, its heartbeat), its recorded
gaps, and :class:`Scope`, the index ranges "overlaps the window" is read as.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Integer, and_, case, func, literal_column, select
from sqlalchemy.engine import Connection

from gpuquota.quota.report.sql import t
from gpuquota.quota.store.models import (
    SPAN_CLASS_BOUNDS,
    SPAN_CLASS_SQL,
    Allocation,
    ClaimAllocation,
    Cluster,
    Gap,
    Heartbeat,
)


@dataclass(frozen=True)
class Scope:
    """Which allocation rows a window can touch, phrased so that B-tree indexes serve it.

    "Overlaps [lo, hi)" is not one index range. Split by length class (models.SPAN_CLASS_SQL,
    index ix_allocations_span), it is: a closed interval of class k is shorter than its bound
    b_k, so it overlaps the window only if it started in [lo - b_k, hi). The last class is
    bounded by the longest closed interval (one probe of ix_allocations_duration); intervals
    still running come from ix_allocations_open. The parts are the branches of one UNION ALL
    (SQLite would not use several ranges of one OR). The cluster equality leads the indexes,
    so a report over every cluster names them all (loose index scan)."""

    clusters: tuple[str, ...]
    longest: int | None  # longest closed interval in seconds; None: no closed intervals
    # per cluster, the last time the store knew its state (heartbeat): open intervals end there
    known_until: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, conn: Connection, cluster: str | None) -> Scope:
        a = Allocation
        longest = conn.execute(select(func.max(a.ended_at - a.started_at))).scalar()
        clusters = (
            (cluster,)
            if cluster is not None
            else tuple(sorted({*distinct_clusters(conn), *claim_clusters(conn)}))
        )
        until = tuple(
            (c.cluster, c.known_until)
            for c in coverage(conn, clusters)
            if c.known_until is not None
        )
        return cls(clusters, None if longest is None else int(longest), until)

    def open_end(self, cluster_column: Any, now: int) -> ColumnElement[int]:
        """SQL: where an interval still open in ``cluster_column``'s cluster ends for the
        report: the earlier of ``now`` and the last time the store knew that cluster."""
        whens = [(cluster_column == c, t(min(now, at))) for c, at in self.known_until if at < now]
        return case(*whens, else_=t(now)) if whens else t(now)

    def parts(self, lo: int, hi: int) -> list[ColumnElement[bool]]:
        a = Allocation
        cluster = a.cluster.in_(self.clusters)
        span: ColumnElement[int] = literal_column(SPAN_CLASS_SQL, Integer)
        bounds = [*SPAN_CLASS_BOUNDS, max(self.longest or 0, SPAN_CLASS_BOUNDS[-1])]
        parts: list[ColumnElement[bool]] = [
            and_(
                cluster,
                span == k,
                a.started_at >= t(lo - bound),
                a.started_at < t(hi),
                a.ended_at > t(lo),
            )
            for k, bound in enumerate(bounds)
        ]
        ends = dict(self.known_until)
        stale = [c for c in self.clusters if c in ends and ends[c] < hi]
        fresh = [c for c in self.clusters if c not in stale]
        if fresh:
            parts.append(and_(a.cluster.in_(fresh), a.ended_at.is_(None), a.started_at < t(hi)))
        for c in stale:  # nothing started after the data ends is known to run in the window
            parts.append(and_(a.cluster == c, a.ended_at.is_(None), a.started_at < t(ends[c])))
        return parts


def distinct_clusters(conn: Connection) -> list[str]:
    """Cluster names in the allocations table by a loose index scan (one probe per cluster)."""
    a = Allocation
    inner = Allocation.__table__.alias("inner")
    seed = select(func.min(a.cluster).label("name")).cte("clusters", recursive=True)
    step = select(
        select(func.min(inner.c.cluster)).where(inner.c.cluster > seed.c.name).scalar_subquery()
    ).where(seed.c.name.is_not(None))
    walk = seed.union_all(step)
    return [r[0] for r in conn.execute(select(walk.c.name).where(walk.c.name.is_not(None)))]


def claim_clusters(conn: Connection) -> set[str]:
    """Cluster names in the DRA claim rows (a cluster may have only those)."""
    c = ClaimAllocation
    return {str(r[0]) for r in conn.execute(select(c.cluster).distinct())}


@dataclass(frozen=True)
class ClusterCoverage:
    """Where one cluster's data ends: the last time the store knew its state, written by the
    controller's heartbeat or, for a replayed recording, at its last event."""

    cluster: str
    known_until: int | None  # None: no heartbeat (rows written by something else)
    source: str | None  # the heartbeat's holder: "replay", or the controller's identity


def coverage(conn: Connection, clusters: Sequence[str]) -> list[ClusterCoverage]:
    h = Heartbeat
    beats = {
        str(c): (int(at), str(holder))
        for c, at, holder in conn.execute(
            select(h.cluster, h.at, h.holder).where(h.cluster.in_(list(clusters)))
        )
    }
    return [
        ClusterCoverage(c, beats[c][0], beats[c][1])
        if c in beats
        else ClusterCoverage(c, None, None)
        for c in clusters
    ]


@dataclass(frozen=True)
class GapRecord:
    """A span in which the controller could not follow one kind of a cluster (models.Gap)."""

    cluster: str
    kind: str
    started_at: int
    ended_at: int
    reason: str

    @property
    def seconds(self) -> int:
        return self.ended_at - self.started_at


def gaps(conn: Connection, clusters: Sequence[str], lo: int, hi: int) -> list[GapRecord]:
    """The stored gaps of ``clusters`` that overlap [lo, hi), oldest first."""
    g = Gap
    rows = conn.execute(
        select(g.cluster, g.kind, g.started_at, g.ended_at, g.reason)
        .where(
            g.cluster.in_(list(clusters)),
            g.started_at < t(hi),
            g.ended_at > t(lo),
        )
        .order_by(g.started_at, g.cluster, g.kind)
    )
    return [GapRecord(str(c), str(k), int(a), int(b), str(r)) for c, k, a, b, r in rows]


def data_begins(conn: Connection, clusters: Sequence[str]) -> dict[str, int]:
    """When each cluster's data begins: the first time the store knew it (its clusters row,
    written with the first batch's observation time); clusters without a row are left out."""
    return {
        str(name): int(at)
        for name, at in conn.execute(
            select(Cluster.name, Cluster.created_at).where(Cluster.name.in_(list(clusters)))
        )
    }


def known_clusters(conn: Connection) -> list[str]:
    """Every cluster the store holds anything of (its clusters table, and allocations)."""
    named = {str(r[0]) for r in conn.execute(select(Cluster.name))}
    return sorted(named | set(distinct_clusters(conn)) | claim_clusters(conn))
