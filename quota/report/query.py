"""The report's SQL: clip intervals to sub-windows and SUM ... GROUP BY inside the database.

Every interval [start, end) is clipped to each sub-window [b_i, b_i+1) with
GREATEST/LEAST (PostgreSQL) or the scalar MAX/MIN (SQLite), giving one SUM column per
sub-window in one scan. Sub-windows are the report window split at rate changes (and at chart
buckets), so pricing and charting need no second pass. Python only sees the grouped rows.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Integer,
    Select,
    String,
    and_,
    case,
    cast,
    column,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import GenericFunction

from gpuquota.quota.accounting.rules.claims import (
    ALLOCATION_PATH_DEVICE_PLUGIN,
    ALLOCATION_PATH_DRA,
)
from gpuquota.quota.store.models import (
    BEST_EFFORT_SQL,
    SPAN_CLASS_BOUNDS,
    SPAN_CLASS_SQL,
    Allocation,
    ClaimAllocation,
    Cluster,
    Gap,
    Heartbeat,
    LedgerProgress,
    NamespaceLabels,
    NodeCapacity,
    QuotaSample,
    UsageDevice,
    UsageSeries,
    UsageWindow,
)

# Keys a report can group by, mapped to Allocation columns (label:<key> is handled apart).
GROUP_COLUMNS: dict[str, tuple[Any, ...]] = {
    "namespace": (Allocation.namespace,),
    "model": (Allocation.gpu_model,),
    "node": (Allocation.node,),
    "pool": (Allocation.node_pool,),
    "cluster": (Allocation.cluster,),
    # an owner is keyed within its namespace: Job/eval of two namespaces are two owners
    "owner": (Allocation.namespace, Allocation.owner_kind, Allocation.owner_name),
    "resource": (Allocation.resource_name,),
    "pod": (Allocation.namespace, Allocation.pod_name),
    # which way the GPUs were allocated: device-plugin (extended resources) or dra (claims)
    "path": (column("allocation_path", String),),
}
PATH_COLUMN = "allocation_path"
# keys that tell the pods of a shared DRA claim apart: grouped by one of them, a shared claim's
# time is split equally among the pods using it at each instant (accounting.md, policy);
# every other key (namespace, namespace labels, model, pool, node, resource, path, cluster)
# is the claim's own and keeps the claim's charged pieces whole
POD_LEVEL_KEYS = frozenset({"owner", "pod"})
SPLIT_COLUMN = "split"  # pods sharing the row's time: its seconds count 1/split each
COUNTED_COLUMN = "counted"  # 1 where the row starts an interval the report counts
FAR_FUTURE = 2**62


class greatest(GenericFunction[int]):  # noqa: N801 - SQL function name
    type = Integer()
    inherit_cache = True


class least(GenericFunction[int]):  # noqa: N801 - SQL function name
    type = Integer()
    inherit_cache = True


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: SQLCompiler, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


@compiles(least, "sqlite")
def _least_sqlite(element: least, compiler: SQLCompiler, **kw: Any) -> str:
    return f"min({compiler.process(element.clauses, **kw)})"


def clipped(start: Any, end: Any, lo: Any, hi: Any) -> ColumnElement[int]:
    """Seconds of [start, end) inside [lo, hi), never negative.

    Cast to a 32-bit integer (a clipped length is at most the window, far below 2**31 s) so
    PostgreSQL sums it in a bigint accumulator instead of numeric."""
    return cast(greatest(least(end, hi) - greatest(start, lo), 0), Integer)


def t(value: int) -> ColumnElement[int]:
    """A bound unix time as BIGINT (PostgreSQL would otherwise cast it to integer)."""
    return literal(value, BigInteger)


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


def best_effort_pods(conn: Connection, scope: Scope, lo: int, hi: int, now: int) -> dict[str, int]:
    """Per namespace, the pods that held GPUs in [lo, hi) while BestEffort: QoS looks only at
    cpu and memory, so NotBestEffort-scoped quotas never counted them (accounting.md)."""
    a = Allocation
    parts = scope.parts(lo, min(hi, now))
    scoped = union_all(
        # the partial index's own condition, literally (SQLite uses it only then)
        *(select(a.namespace, a.pod_uid).where(part, text(BEST_EFFORT_SQL)) for part in parts)
    ).subquery("best_effort")
    rows = conn.execute(
        select(scoped.c.namespace, func.count(func.distinct(scoped.c.pod_uid))).group_by(
            scoped.c.namespace
        )
    )
    return {str(namespace): int(count) for namespace, count in rows}


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


def claim_part(scope: Scope, lo: int, hi: int) -> ColumnElement[bool]:
    """DRA claim rows that overlap [lo, hi); empty pieces (a pod whose time another pod of the
    shared claim already carries) are left out."""
    c = ClaimAllocation
    return and_(
        c.cluster.in_(scope.clusters),
        c.started_at < t(hi),
        or_(c.ended_at.is_(None), and_(c.ended_at > t(lo), c.ended_at > c.started_at)),
    )


def claim_split_segments(scope: Scope, lo: int, hi: int, now: int) -> Any:
    """DRA claim time as each pod's equal share, for grouping by a pod-level key (policy).

    A claim is charged over the union of its pods' billing intervals; at each instant that
    time belongs equally to the pods inside their intervals then. Per (claim, device class),
    the pods' starts and ends cut the time into segments in which the same pods hold it; one
    row per (segment, pod holding it), with ``split`` = the pods holding it, so the grouped
    sums stay whole seconds and the division is exact in Python. The segments of one instant
    add up to the claim's charged time, so namespace totals are what the pieces give. Claims
    charged through a pod's extended resource (every piece empty) are left out, as in the
    pieces. ``counted`` marks each pod's first segment: one interval per (claim, pod)."""
    c = ClaimAllocation.__table__.c
    claim_key = (c.cluster, c.claim_uid, c.resource_name)
    pod_end = func.coalesce(c.pod_ended_at, scope.open_end(c.cluster, now))
    nonempty = case((or_(c.ended_at.is_(None), c.ended_at > c.started_at), 1), else_=0)
    carried = [col for col in ClaimAllocation.__table__.columns if col.key not in _REPLACED]
    pods = (
        select(
            *carried,
            c.pod_started_at.label("pod_start"),
            pod_end.label("pod_end"),
            func.max(nonempty).over(partition_by=claim_key).label("charged"),
        )
        .where(
            c.cluster.in_(scope.clusters),
            c.pod_started_at < t(hi),
            or_(c.pod_ended_at.is_(None), c.pod_ended_at > t(lo)),
        )
        .subquery("claim_pods")
    )
    p = pods.c
    held = select(pods).where(p.charged == 1, p.pod_end > p.pod_start).cte("claim_pods_held")
    h = held.c
    key = (h.cluster, h.claim_uid, h.resource_name)
    points = union_all(
        select(*key, h.pod_start.label("at")), select(*key, h.pod_end.label("at"))
    ).subquery("claim_points")
    pt = points.c
    edges = (
        select(pt.cluster, pt.claim_uid, pt.resource_name, pt.at).distinct().subquery("claim_edges")
    )
    e = edges.c
    seg = select(
        e.cluster,
        e.claim_uid,
        e.resource_name,
        e.at.label("seg_start"),
        func.lead(e.at)
        .over(partition_by=(e.cluster, e.claim_uid, e.resource_name), order_by=e.at)
        .label("seg_end"),
    ).subquery("claim_segments")
    s = seg.c
    same_claim = and_(
        h.cluster == s.cluster, h.claim_uid == s.claim_uid, h.resource_name == s.resource_name
    )
    pod_key = (h.cluster, h.claim_uid, h.pod_uid, h.resource_name)
    first = func.row_number().over(partition_by=pod_key, order_by=s.seg_start)
    return (
        select(
            *(h[col.key] for col in carried),
            s.seg_start.label("started_at"),
            s.seg_end.label("ended_at"),
            cast(
                func.count().over(
                    partition_by=(s.cluster, s.claim_uid, s.resource_name, s.seg_start)
                ),
                Integer,
            ).label(SPLIT_COLUMN),
            case((first == 1, 1), else_=0).label(COUNTED_COLUMN),
        )
        .select_from(seg.join(held, same_claim))
        .where(
            s.seg_end.is_not(None),
            h.pod_start <= s.seg_start,
            h.pod_end >= s.seg_end,
            s.seg_start < t(hi),
            s.seg_end > t(lo),
        )
        .subquery("claim_split")
    )


# columns of a claim row the split segments give their own values
_REPLACED = frozenset({"started_at", "ended_at"})


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


@dataclass(frozen=True)
class UsageRow:
    """Allocations of one group sharing a price and a physical fraction."""

    keys: tuple[str | None, ...]  # one value per group key (owner: "Kind/name")
    resource_name: str
    gpu_model: str | None
    raw_units: int
    physical_gpus: float
    # per sub-window, of the whole interval (multiply by raw_units, divide by split)
    seconds: tuple[int, ...]
    estimated_seconds: int  # seconds (whole window) of intervals closed by estimate
    intervals: int
    estimated_intervals: int
    mig_profile: str | None = None  # single-strategy MIG: the profile behind nvidia.com/gpu
    share: Fraction = Fraction(1)  # the exact physical share of one unit, as stored
    # the pods sharing these seconds equally (a shared DRA claim grouped by a pod-level key):
    # the group is charged seconds / split of them; 1 everywhere else
    split: int = 1

    @property
    def price_class(self) -> tuple[Any, ...]:
        return (
            self.resource_name,
            self.gpu_model,
            self.raw_units,
            self.physical_gpus,
            self.mig_profile,
            self.share,
            self.split,
        )


def _key_values(keys: Sequence[str], row: Sequence[Any]) -> tuple[tuple[str | None, ...], int]:
    """Fold the selected key columns of ``row`` into one value per key; returns the offset."""
    values: list[str | None] = []
    i = 0
    for key in keys:
        if key == "owner":
            namespace, kind, name = row[i], row[i + 1], row[i + 2]
            values.append(f"{namespace}/{kind}/{name}" if name else None)
            i += 3
        elif key == "pod":
            values.append(f"{row[i]}/{row[i + 1]}")
            i += 2
        else:
            values.append(row[i])
            i += 1
    return tuple(values), i


def usage(
    conn: Connection,
    keys: Sequence[str],
    edges: Sequence[int],
    now: int,
    cluster: str | None = None,
    scope: Scope | None = None,
) -> list[UsageRow]:
    """Allocation seconds per group and sub-window ``edges[i]..edges[i+1]``.

    Keys are GROUP_COLUMNS names or ``label:<name>``; namespace labels are taken from
    NamespaceLabels as they were at the time, splitting intervals where labels changed. Time a
    namespace had no recorded labels comes back with label value None."""
    label_keys = [k.split(":", 1)[1] for k in keys if k.startswith("label:")]
    plain = [k for k in keys if not k.startswith("label:")]
    scope = scope or Scope.of(conn, cluster)  # a report asks for it once, for every query
    n = len(edges) - 1
    parts = scope.parts(edges[0], min(edges[-1], now))
    split = any(k in POD_LEVEL_KEYS for k in keys)
    base_rows = [
        _usage_row(plain, r, n)
        for r in conn.execute(_usage_query(plain, [], edges, now, parts, scope, split))
    ]
    if not label_keys:
        return base_rows
    # Query results carry plain keys first, then label values; restore the requested order.
    labelled_keys = plain + [f"label:{k}" for k in label_keys]
    rows = [
        _usage_row(labelled_keys, r, n)
        for r in conn.execute(_usage_query(plain, label_keys, edges, now, parts, scope, split))
    ]
    rows += _unlabelled(base_rows, rows, len(plain), len(label_keys))
    order = [k for k in keys if not k.startswith("label:")] + [
        k for k in keys if k.startswith("label:")
    ]
    position = [order.index(k) for k in keys]
    return [dataclasses.replace(r, keys=tuple(r.keys[p] for p in position)) for r in rows]


def _usage_query(
    plain: Sequence[str],
    label_keys: Sequence[str],
    edges: Sequence[int],
    now: int,
    parts: Sequence[ColumnElement[bool]],
    scope: Scope,
    split: bool = False,
) -> Select[Any]:
    """One grouped query over the UNION ALL of the scope's parts (each an index range; the
    database runs them side by side where it can, PostgreSQL with a Parallel Append).

    DRA claims come in as their charged pieces, or with ``split`` (a pod-level key) as
    :func:`claim_split_segments`."""
    a = Allocation
    needed = {c.key for k in plain for c in GROUP_COLUMNS[k]} - {PATH_COLUMN} | {
        "cluster",
        "namespace",
        "resource_name",
        "gpu_model",
        "raw_units",
        "physical_gpus",
        "share_numerator",
        "share_denominator",
        "started_at",
        "ended_at",
        "estimated",
        "mig_profile",
    }
    columns_in = [c for c in a.__table__.columns if c.key in needed]
    whole_rows = (
        literal(1, Integer).label(SPLIT_COLUMN),
        literal(1, Integer).label(COUNTED_COLUMN),
    )
    # DRA claim rows have the same columns (their pieces add up like allocations), tagged with
    # the allocation path
    claims: Select[Any]
    if split:
        segments = claim_split_segments(scope, edges[0], min(edges[-1], now), now)
        claims = select(
            *(segments.c[c.key] for c in columns_in),
            literal(ALLOCATION_PATH_DRA, String).label(PATH_COLUMN),
            segments.c[SPLIT_COLUMN],
            segments.c[COUNTED_COLUMN],
        )
    else:
        claims = select(
            *(ClaimAllocation.__table__.c[c.key] for c in columns_in),
            literal(ALLOCATION_PATH_DRA, String).label(PATH_COLUMN),
            *whole_rows,
        ).where(claim_part(scope, edges[0], min(edges[-1], now)))
    u = union_all(
        *(
            select(
                *columns_in,
                literal(ALLOCATION_PATH_DEVICE_PLUGIN, String).label(PATH_COLUMN),
                *whole_rows,
            ).where(part)
            for part in parts
        ),
        claims,
    ).subquery("scoped")
    start: Any = u.c.started_at
    end: Any = func.coalesce(u.c.ended_at, scope.open_end(u.c.cluster, now))
    lo_bound: Any = None
    hi_bound: Any = None
    group: list[Any] = [u.c[c.key] for k in plain for c in GROUP_COLUMNS[k]]
    if label_keys:
        nl = NamespaceLabels
        lo_bound, hi_bound = nl.valid_from, func.coalesce(nl.valid_to, t(FAR_FUTURE))
        group += [nl.labels[k].as_string() for k in label_keys]
    lo, hi = edges[0], min(edges[-1], now)

    def clip(b0: int, b1: int) -> ColumnElement[int]:
        w0: Any = t(b0) if lo_bound is None else greatest(lo_bound, t(b0))
        w1: Any = t(min(b1, now)) if hi_bound is None else least(hi_bound, t(min(b1, now)))
        return clipped(start, end, w0, w1)

    windows = [func.sum(clip(b0, b1)) for b0, b1 in itertools.pairwise(edges)]
    whole = clip(lo, edges[-1])
    est = cast(u.c.estimated, Boolean)
    price_class = [
        u.c.resource_name,
        u.c.gpu_model,
        u.c.raw_units,
        u.c.physical_gpus,
        u.c.mig_profile,
        u.c.share_numerator,
        u.c.share_denominator,
        u.c[SPLIT_COLUMN],
    ]
    stmt = select(
        *group,
        *price_class,
        *windows,
        func.sum(case((est, whole), else_=0)),
        func.sum(u.c[COUNTED_COLUMN]),
        func.sum(case((est, u.c[COUNTED_COLUMN]), else_=0)),
    ).select_from(u)
    if label_keys:
        nl = NamespaceLabels
        stmt = stmt.join(
            nl,
            and_(
                nl.cluster == u.c.cluster,
                nl.namespace == u.c.namespace,
                nl.valid_from < t(hi),
                or_(nl.valid_to.is_(None), nl.valid_to > t(lo)),
                nl.valid_from < end,
                func.coalesce(nl.valid_to, t(FAR_FUTURE)) > u.c.started_at,
            ),
        )
    return stmt.group_by(*group, *price_class)


def _usage_row(keys: Sequence[str], r: Sequence[Any], n_windows: int) -> UsageRow:
    values, i = _key_values(keys, r)
    resource, model, units, physical, profile = (
        r[i],
        r[i + 1],
        int(r[i + 2]),
        float(r[i + 3]),
        r[i + 4],
    )
    share = Fraction(int(r[i + 5]), int(r[i + 6]))
    split = int(r[i + 7])
    i += 8
    seconds = tuple(int(s or 0) for s in r[i : i + n_windows])
    est_s, count, est_n = r[i + n_windows : i + n_windows + 3]
    return UsageRow(
        values,
        resource,
        model,
        units,
        physical,
        seconds,
        int(est_s or 0),
        int(count),
        int(est_n or 0),
        profile,
        share,
        split,
    )


def _unlabelled(
    base: Sequence[UsageRow], labelled: Sequence[UsageRow], n_plain: int, n_labels: int
) -> list[UsageRow]:
    """Time not covered by any NamespaceLabels row: base totals minus labelled totals."""
    covered: dict[tuple[Any, ...], list[int]] = {}
    for r in labelled:
        key = (*r.keys[:n_plain], *r.price_class)
        acc = covered.setdefault(key, [0] * (len(r.seconds) + 1))
        for j, s in enumerate(r.seconds):
            acc[j] += s
        acc[-1] += r.estimated_seconds
    rest: list[UsageRow] = []
    for r in base:
        key = (*r.keys, *r.price_class)
        acc = covered.get(key, [0] * (len(r.seconds) + 1))
        seconds = tuple(s - c for s, c in zip(r.seconds, acc, strict=False))
        est = r.estimated_seconds - acc[-1]
        if any(seconds) or est:
            rest.append(
                dataclasses.replace(
                    r, keys=(*r.keys, *([None] * n_labels)), seconds=seconds, estimated_seconds=est
                )
            )
    return rest


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


@dataclass(frozen=True)
class QuotaRow:
    """One quota's figures for one resource over the window, summed over a group's namespaces.

    Each (namespace, quota, resource) is a step function of its samples, so its average can
    never exceed its peak; figures of different resources (whole GPUs, MIG slices, shared
    replicas) are never added together."""

    keys: tuple[str | None, ...]  # one value per report key (namespace, cluster, label:*)
    quota_name: str | None  # None where the group adds up several namespaces' quotas
    resource_name: str  # in requests form without the prefix: nvidia.com/gpu
    used_seconds: float  # integral of used over the window (unit-seconds)
    hard_seconds: float  # integral of hard
    unused_seconds: float  # integral of max(hard - used, 0)
    sampled_seconds: float  # how long the window had a sample of this quota (coverage)
    peak_used: float | None  # only when grouped by namespace: peaks of namespaces do not add
    peak_hard: float | None


QUOTA_PLAIN_KEYS = ("namespace", "cluster")


def quota_applies(keys: Sequence[str]) -> bool:
    """Quota figures exist per namespace: a report gets them when it groups by namespace or a
    namespace label, and by nothing finer than a namespace (only cluster besides)."""
    return all(k in QUOTA_PLAIN_KEYS or k.startswith("label:") for k in keys) and (
        "namespace" in keys or any(k.startswith("label:") for k in keys)
    )


def quota_resource(name: str) -> str:
    """A quota's resource in the report: ``requests.X`` and bare ``X`` both count requests."""
    return name[len("requests.") :] if name.startswith("requests.") else name


def quota(
    conn: Connection,
    keys: Sequence[str],
    lo: int,
    hi: int,
    now: int,
    cluster: str | None = None,
    scope: Scope | None = None,
) -> list[QuotaRow]:
    """Time-weighted quota hard/used per group, quota and resource from QuotaSample history (a
    step function: each sample holds until the next one of the same quota and resource, and
    the last one until the cluster's data ends). Keys: namespace, cluster and label:<key>
    (labels as they were, split where they changed; time without recorded labels under None).

    Counts resources in requests form (``requests.X`` or bare ``X``), not ``limits.X``, so a
    quota that sets both is not counted twice; where a quota sets both ``requests.X`` and
    ``X``, the ``requests.X`` samples are used."""
    label_keys = [k.split(":", 1)[1] for k in keys if k.startswith("label:")]
    plain = [k for k in keys if not k.startswith("label:")]
    if any(k not in QUOTA_PLAIN_KEYS for k in plain):
        raise ValueError(f"quota figures cannot be grouped by {plain}")
    scope = scope or Scope.of(conn, cluster)
    hi = min(hi, now)
    if hi <= lo:
        return []
    peaks = "namespace" in plain
    base = _requests_form(
        _quota_row(len(plain), r, peaks)
        for r in conn.execute(_quota_query(plain, [], lo, hi, cluster, scope))
    )
    if not label_keys:
        return base
    labelled = _requests_form(
        _quota_row(len(plain) + len(label_keys), r, peaks)
        for r in conn.execute(_quota_query(plain, label_keys, lo, hi, cluster, scope))
    )
    covered: dict[tuple[Any, ...], list[float]] = {}
    for r in labelled:
        acc = covered.setdefault((*r.keys[: len(plain)], r.quota_name, r.resource_name), [0.0] * 4)
        acc[0] += r.used_seconds
        acc[1] += r.hard_seconds
        acc[2] += r.unused_seconds
        acc[3] += r.sampled_seconds
    for r in base:  # time a namespace had no recorded labels
        acc = covered.get((*r.keys, r.quota_name, r.resource_name), [0.0] * 4)
        rest = (
            r.used_seconds - acc[0],
            r.hard_seconds - acc[1],
            r.unused_seconds - acc[2],
            r.sampled_seconds - acc[3],
        )
        if any(abs(x) > 1e-6 * max(1.0, r.hard_seconds) for x in rest):
            labelled.append(
                QuotaRow(
                    (*r.keys, *([None] * len(label_keys))),
                    r.quota_name,
                    r.resource_name,
                    *rest,
                    None,
                    None,
                )
            )
    order = plain + [f"label:{k}" for k in label_keys]
    position = [order.index(k) for k in keys]
    return [dataclasses.replace(r, keys=tuple(r.keys[p] for p in position)) for r in labelled]


def _requests_form(rows: Iterable[tuple[QuotaRow, bool]]) -> list[QuotaRow]:
    """Fold ``requests.X`` and ``X`` of one quota into one row, preferring ``requests.X``."""
    chosen: dict[tuple[Any, ...], tuple[bool, QuotaRow]] = {}
    for row, prefixed in rows:
        key = (row.keys, row.quota_name, row.resource_name)
        if key not in chosen or (prefixed and not chosen[key][0]):
            chosen[key] = (prefixed, row)
    return [row for _prefixed, row in chosen.values()]


def _quota_query(
    plain: Sequence[str],
    label_keys: Sequence[str],
    lo: int,
    hi: int,
    cluster: str | None,
    scope: Scope,
) -> Select[Any]:
    q = QuotaSample
    nxt = (
        func.lead(q.observed_at)
        .over(
            partition_by=(q.cluster, q.namespace, q.quota_name, q.resource_name),
            order_by=(q.observed_at, q.seq),
        )
        .label("next_at")
    )
    samples = select(
        q.cluster, q.namespace, q.quota_name, q.resource_name, q.hard, q.used, q.observed_at, nxt
    ).where(q.observed_at < t(hi), ~q.resource_name.startswith("limits."))
    if cluster is not None:
        samples = samples.where(q.cluster == cluster)
    s = samples.subquery()
    start: Any = s.c.observed_at
    # the last sample holds until the cluster's data ends (or the window does)
    last_end: Any = scope.open_end(s.c.cluster, hi)
    end: Any = func.coalesce(s.c.next_at, last_end)
    group: list[Any] = [getattr(s.c, k) for k in plain]
    quota_name: Any = s.c.quota_name if "namespace" in plain else literal(None, String)
    if "namespace" in plain:
        group.append(s.c.quota_name)
    if label_keys:
        nl = NamespaceLabels
        start = greatest(start, nl.valid_from)
        end = least(end, func.coalesce(nl.valid_to, t(FAR_FUTURE)))
        group += [nl.labels[k].as_string() for k in label_keys]
    group.append(s.c.resource_name)
    dur = clipped(start, end, t(lo), t(hi))
    used = func.coalesce(s.c.used, 0)
    hard = func.coalesce(s.c.hard, 0)
    # a sample that held for no whole second (another followed in the same second) still
    # counts for the peak where it was taken inside the window (and its labels' period)
    taken: Any = and_(s.c.observed_at >= t(lo), s.c.observed_at < t(hi))
    if label_keys:
        taken = and_(
            taken,
            NamespaceLabels.valid_from <= s.c.observed_at,
            func.coalesce(NamespaceLabels.valid_to, t(FAR_FUTURE)) > s.c.observed_at,
        )
    counts = or_(dur > 0, taken)
    # the very label expressions grouped by (PostgreSQL matches them with their parameters)
    key_columns = [getattr(s.c, k) for k in plain] + group[-1 - len(label_keys) : -1]
    stmt = select(
        *key_columns,
        quota_name,
        s.c.resource_name,
        func.sum(used * dur),
        func.sum(hard * dur),
        func.sum(case((hard > used, (hard - used) * dur), else_=0)),
        func.sum(dur),
        func.max(case((counts, s.c.used), else_=None)),
        func.max(case((counts, s.c.hard), else_=None)),
    ).where(func.coalesce(s.c.next_at, last_end) > t(lo))
    if label_keys:
        nl = NamespaceLabels
        stmt = stmt.select_from(s).join(
            nl,
            and_(
                nl.cluster == s.c.cluster,
                nl.namespace == s.c.namespace,
                nl.valid_from < func.coalesce(s.c.next_at, last_end),
                func.coalesce(nl.valid_to, t(FAR_FUTURE)) > s.c.observed_at,
            ),
        )
    return stmt.group_by(*group)


def _quota_row(n_keys: int, r: Sequence[Any], peaks: bool) -> tuple[QuotaRow, bool]:
    quota_name, resource = r[n_keys], str(r[n_keys + 1])
    used, hard, unused, sampled, peak_used, peak_hard = r[n_keys + 2 : n_keys + 8]
    row = QuotaRow(
        tuple(r[:n_keys]),
        None if quota_name is None else str(quota_name),
        quota_resource(resource),
        float(used or 0),
        float(hard or 0),
        float(unused or 0),
        float(sampled or 0),
        None if peak_used is None or not peaks else float(peak_used),
        None if peak_hard is None or not peaks else float(peak_hard),
    )
    return row, resource.startswith("requests.")


@dataclass(frozen=True)
class LedgerRow:
    """What one group's holders used, from the usage ledger (usage_windows), over the window.

    Ledger windows are whole; one that a period edge (or a sub-window edge: a price change)
    cuts counts pro rata to time."""

    keys: tuple[str | None, ...]
    used_seconds: float  # physical GPU-seconds of activity
    sampled_seconds: float  # seconds with samples, summed over the holders' devices
    energy: tuple[float, ...]  # joules per sub-window


# ledger windows are at most a day long (the controller's default is an hour): a window that
# overlaps [lo, hi) started after lo - this
LEDGER_MAX_WINDOW = 86400
HOLDER_POD = "pod"
HOLDER_CLAIM = "claim"
HOLDER_UNALLOCATED = "unallocated"


# a window's figures, stored in single precision (models.UsageWindow)
FIGURES = (UsageWindow.used_gpu_seconds, UsageWindow.sampled_seconds, UsageWindow.energy_joules)


def double(column: Any) -> Any:
    """A single-precision figure as double precision, before any arithmetic or sum (PostgreSQL
    sums REAL in REAL)."""
    return cast(column, Float)


def ledger_present(conn: Connection, scope: Scope) -> bool:
    """Whether the usage ledger holds anything for the clusters in scope (its progress row,
    written by the controller's ingestion, or any series)."""
    if not scope.clusters:
        return False
    found = (
        conn.execute(
            select(LedgerProgress.cluster)
            .where(LedgerProgress.cluster.in_(scope.clusters))
            .limit(1)
        ).first()
        or conn.execute(
            select(UsageSeries.id).where(UsageSeries.cluster.in_(scope.clusters)).limit(1)
        ).first()
    )
    return found is not None


def ledger_progress(conn: Connection, scope: Scope) -> dict[str, int]:
    """Per cluster in scope, the time up to which every ledger window is ingested."""
    p = LedgerProgress
    return {
        str(c): int(at)
        for c, at in conn.execute(
            select(p.cluster, p.ingested_until).where(p.cluster.in_(scope.clusters))
        )
    }


# keys the ledger's series carry themselves, as the allocations do (the pod's namespace, the
# cluster; the node on the series' device): grouped by these alone, the ledger needs no join to
# the allocations
SERIES_KEYS: dict[str, Any] = {
    "namespace": UsageSeries.namespace,
    "cluster": UsageSeries.cluster,
    "node": UsageDevice.node,
}


def _ledger_windows(
    scope: Scope,
    edges: Sequence[int],
    now: int,
    label_keys: Sequence[str],
    by: Sequence[str] | None = None,
) -> Any:
    """Per ledger series (and label values, where grouped by labels), the used, sampled and
    per-sub-window energy figures of its windows inside [edges[0], min(edges[-1], now)): one
    grouped scan of the windows' time range (index ix_usage_windows_start)."""
    w, s = UsageWindow, UsageSeries
    lo, hi = edges[0], min(edges[-1], now)
    wend: Any = w.window_start + w.window_seconds
    length = cast(w.window_seconds, Float)
    used, sampled, joules = (double(c) for c in FIGURES)

    def part(b0: int, b1: int) -> Any:
        return clipped(w.window_start, wend, t(b0), t(min(b1, now))) / length

    labels: list[Any] = []
    stmt_from: Any = w.__table__.join(s.__table__, s.id == w.series_id)
    if by is not None and any(SERIES_KEYS[k].class_ is UsageDevice for k in by):
        stmt_from = stmt_from.outerjoin(UsageDevice.__table__, UsageDevice.id == s.device_id)
    if label_keys:
        nl = NamespaceLabels
        stmt_from = stmt_from.outerjoin(
            nl.__table__,
            and_(
                nl.cluster == s.cluster,
                nl.namespace == s.namespace,
                nl.valid_from <= w.window_start,
                func.coalesce(nl.valid_to, t(FAR_FUTURE)) > w.window_start,
            ),
        )
        labels = [nl.labels[k].as_string().label(f"label_{i}") for i, k in enumerate(label_keys)]
    # per series, or (``by``: SERIES_KEYS) straight per group
    group: list[Any] = (
        [w.series_id.label("series_id")] if by is None else [SERIES_KEYS[k].label(k) for k in by]
    )
    pairs = list(itertools.pairwise(edges))

    def branch(whole: bool) -> Select[Any]:
        """Windows wholly inside the period (``whole``: no clipping, plain sums, nearly every
        window) or cut by its edges (pro rata)."""
        inside: Any = 1 if whole else part(lo, hi)
        energy = [
            func.sum(joules if whole and len(pairs) == 1 else joules * part(b0, b1)).label(
                f"energy_{i}"
            )
            for i, (b0, b1) in enumerate(pairs)
        ]
        where = (
            and_(w.window_start >= t(lo), wend <= t(hi))
            if whole
            else and_(
                wend > t(lo),
                w.window_start < t(hi),
                # two short ranges of ix_usage_windows_start: windows that start before the
                # period, and windows that end after it
                or_(
                    and_(w.window_start >= t(lo - LEDGER_MAX_WINDOW), w.window_start < t(lo)),
                    and_(w.window_start > t(hi - LEDGER_MAX_WINDOW), wend > t(hi)),
                ),
            )
        )
        return (
            select(
                *group,
                *labels,
                func.sum(used * inside).label("used"),
                func.sum(sampled * inside).label("sampled"),
                *energy,
            )
            .select_from(stmt_from)
            .where(s.cluster.in_(scope.clusters), s.holder_kind.in_((HOLDER_POD, HOLDER_CLAIM)))
            .where(where)
            .group_by(*group, *labels)
        )

    both = union_all(branch(True), branch(False)).subquery("ledger_parts")
    cols = list(both.c)
    keys = cols[: len(group) + len(labels)]
    return (
        select(*keys, *(func.sum(c).label(c.key) for c in cols[len(keys) :]))
        .group_by(*keys)
        .subquery("ledger_series")
    )


def unallocated_energy(
    conn: Connection, lo: int, hi: int, now: int, scope: Scope
) -> dict[str, float]:
    """Per cluster, the joules of GPUs nobody held in [lo, min(hi, now)) (the ledger's
    ``unallocated`` series: the nodes' idle GPU energy), windows cut pro rata."""
    hi = min(hi, now)
    if hi <= lo or not scope.clusters:
        return {}
    w, s = UsageWindow, UsageSeries
    # a few series (one per GPU): their windows through the primary key, not a time scan
    ids = [
        int(i)
        for (i,) in conn.execute(
            select(s.id).where(s.cluster.in_(scope.clusters), s.holder_kind == HOLDER_UNALLOCATED)
        )
    ]
    if not ids:
        return {}
    wend: Any = w.window_start + w.window_seconds
    inside = clipped(w.window_start, wend, t(lo), t(hi)) / cast(w.window_seconds, Float)
    rows = conn.execute(
        select(s.cluster, func.sum(double(w.energy_joules) * inside))
        .select_from(w.__table__.join(s.__table__, s.id == w.series_id))
        .where(
            w.series_id.in_(ids),
            w.window_start >= t(lo - LEDGER_MAX_WINDOW),
            w.window_start < t(hi),
            wend > t(lo),
        )
        .group_by(s.cluster)
    )
    return {str(c): float(j or 0) for c, j in rows}


@dataclass(frozen=True)
class LedgerCut:
    """The usage-ledger windows the period's edges cut (counted pro rata to time, not as
    measured inside the period): rolled-up days of another zone than the report's, or hourly
    windows at a half-hour zone's midnight."""

    windows: int = 0
    longest_seconds: int = 0
    used_seconds: float = 0.0  # the GPU-seconds the report counts from them


def ledger_cut(conn: Connection, scope: Scope, lo: int, hi: int, now: int) -> LedgerCut:
    """How many of the pod and claim holders' ledger windows overlap [lo, min(hi, now)) without
    lying inside it, and what the report counts from them (the edge branch of
    ``_ledger_windows``, in one grouped scan)."""
    hi = min(hi, now)
    if hi <= lo or not scope.clusters:
        return LedgerCut()
    w, s = UsageWindow, UsageSeries
    wend: Any = w.window_start + w.window_seconds
    inside = clipped(w.window_start, wend, t(lo), t(hi)) / cast(w.window_seconds, Float)
    row = conn.execute(
        select(
            func.count(),
            func.max(w.window_seconds),
            func.sum(double(w.used_gpu_seconds) * inside),
        )
        .select_from(w.__table__.join(s.__table__, s.id == w.series_id))
        .where(s.cluster.in_(scope.clusters), s.holder_kind.in_((HOLDER_POD, HOLDER_CLAIM)))
        .where(
            wend > t(lo),
            w.window_start < t(hi),
            or_(
                and_(w.window_start >= t(lo - LEDGER_MAX_WINDOW), w.window_start < t(lo)),
                and_(w.window_start > t(hi - LEDGER_MAX_WINDOW), wend > t(hi)),
            ),
        )
    ).one()
    count, longest, used = row
    return LedgerCut(int(count or 0), int(longest or 0), float(used or 0.0))


def ledger(
    conn: Connection, keys: Sequence[str], edges: Sequence[int], now: int, scope: Scope
) -> list[LedgerRow]:
    """The usage ledger's figures per group (contract of issue #19, section 3).

    A pod's series joins its allocation rows by pod UID, a claim's its claim rows by claim UID:
    the group keys are the allocation's (namespace, owner, model, pool, ...). A pod holding
    several GPU resources (or a claim several device classes, or shared by several pods) has
    its figures split among its rows by physical GPUs (so a shared claim's usage is split
    equally among its pods for the pod-level keys owner and pod). Namespace labels are those
    in force at each window's start. A holder with no allocation row keeps the series' own
    namespace, name, node and model."""
    label_keys = [k.split(":", 1)[1] for k in keys if k.startswith("label:")]
    plain = [k for k in keys if not k.startswith("label:")]
    lo, hi = edges[0], min(edges[-1], now)
    if hi <= lo or not scope.clusters:
        return []
    n = len(edges) - 1
    order = [*plain, *(f"label:{k}" for k in label_keys)]
    position = [order.index(k) for k in keys]
    if all(k in SERIES_KEYS for k in plain):
        # the series' own keys: one grouped scan of the windows, no join to the allocations
        direct = _ledger_windows(scope, edges, now, label_keys, plain)
        return [
            _ledger_row(tuple(None if v is None else str(v) for v in r[: len(order)]),
                        r[len(order) :], n, position)
            for r in conn.execute(select(direct))
        ]  # fmt: skip
    per = _ledger_windows(scope, edges, now, label_keys)
    s, d, a, c = UsageSeries, UsageDevice, Allocation, ClaimAllocation
    label_cols = [per.c[f"label_{i}"] for i in range(len(label_keys))]
    figures = [per.c.used, per.c.sampled, *(per.c[f"energy_{i}"] for i in range(n))]

    def branch(kind: str, src: Any, uid: Any, path: str, *extra: Any) -> Select[Any]:
        # the holder's rows share its figures by physical GPUs
        weight_sum = func.sum(src.physical_gpus).over(partition_by=(per.c.series_id, *label_cols))
        weight: Any = func.coalesce(src.physical_gpus / weight_sum, 1.0)
        cols = {
            "namespace": func.coalesce(src.namespace, s.namespace),
            "pod_name": func.coalesce(src.pod_name, s.holder_name),
            "owner_kind": src.owner_kind,
            "owner_name": src.owner_name,
            "node": func.coalesce(src.node, d.node),
            "node_pool": src.node_pool,
            "gpu_model": func.coalesce(src.gpu_model, d.gpu_model),
            "cluster": s.cluster,
            "resource_name": src.resource_name,
            PATH_COLUMN: literal(path, String),
        }
        return (
            select(
                *(v.label(k) for k, v in cols.items()),
                *label_cols,
                *(f * weight for f in figures),
            )
            .select_from(
                per.join(s.__table__, s.id == per.c.series_id)
                .outerjoin(d.__table__, d.id == s.device_id)
                .outerjoin(
                    src.__table__, and_(src.cluster == s.cluster, uid == s.holder_uid, *extra)
                )
            )
            .where(s.holder_kind == kind)
        )

    claim_in_window = and_(
        c.pod_started_at < t(hi), or_(c.pod_ended_at.is_(None), c.pod_ended_at > t(lo))
    )
    pods = branch(HOLDER_POD, a, a.pod_uid, ALLOCATION_PATH_DEVICE_PLUGIN)
    claims = branch(HOLDER_CLAIM, c, c.claim_uid, ALLOCATION_PATH_DRA, claim_in_window)
    u = union_all(pods, claims).subquery("ledger_holders")
    key_columns = [u.c[col.key] for k in plain for col in GROUP_COLUMNS[k]]
    cols = list(u.c)
    nk = len(LEDGER_KEY_COLUMNS)
    group = [*key_columns, *cols[nk : nk + len(label_keys)]]
    stmt = select(*group, *(func.sum(f) for f in cols[nk + len(label_keys) :])).group_by(*group)
    rows = []
    for r in conn.execute(stmt):
        values, i = _key_values([*plain, *(f"label:{k}" for k in label_keys)], r)
        rows.append(_ledger_row(values, r[i:], n, position))
    return rows


def _ledger_row(
    keys: Sequence[str | None], sums: Sequence[Any], n: int, position: Sequence[int]
) -> LedgerRow:
    """A group's key values (in query order) and its summed figures: used, sampled, then one
    energy sum per price period."""
    energy = tuple(float(e or 0) for e in sums[2 : 2 + n])
    used, sampled = float(sums[0] or 0), float(sums[1] or 0)
    return LedgerRow(tuple(keys[p] for p in position), used, sampled, energy)


# the key columns every ledger branch carries, in order (GROUP_COLUMNS' names)
LEDGER_KEY_COLUMNS = (
    "namespace",
    "pod_name",
    "owner_kind",
    "owner_name",
    "node",
    "node_pool",
    "gpu_model",
    "cluster",
    "resource_name",
    PATH_COLUMN,
)


@dataclass(frozen=True)
class HolderWindow:
    """One ledger window of one holder (pod or claim), its devices added up."""

    holder: tuple[str, str, str]  # cluster, holder kind, holder UID
    namespace: str
    name: str
    owner: str | None  # Kind/name of the pod's controller (a claim: of its first pod)
    gpus: Fraction  # physical GPUs the holder's allocations hold
    open: bool  # an allocation of the holder is still open at the data's end
    start: int
    end: int
    used: float  # physical GPU-seconds of activity
    sampled: float  # seconds of the window with samples (the most of any of its devices)
    last_ingested: bool  # the newest window the report sees for its cluster

    @property
    def sampled_physical(self) -> float:
        """Physical GPU-seconds the window had samples for: sampled x the GPUs held."""
        return self.sampled * float(self.gpus)

    @property
    def cluster(self) -> str:
        return self.holder[0]

    @property
    def holder_kind(self) -> str:
        return self.holder[1]


def _device_share(mig_profile: str | None) -> Fraction:
    """A device's physical share for the activity rule: a MIG instance Ng.* is N/7 of its GPU
    (the node agent's own rule for used GPU-seconds), anything else a whole GPU."""
    if mig_profile:
        head = mig_profile.split("g.", 1)[0]
        if head.isdigit():
            return Fraction(int(head), 7)
    return Fraction(1)


def holder_windows(
    conn: Connection, lo: int, hi: int, now: int, scope: Scope, progress: dict[str, int]
) -> list[HolderWindow]:
    """Every ledger window of every pod and claim holder overlapping [lo, min(hi, now)),
    sorted by holder and time, with the holder's owner, physical GPUs and whether it is still
    allocated (from its allocation rows, joined by UID)."""
    hi = min(hi, now)
    if hi <= lo or not scope.clusters:
        return []
    w, s, d = UsageWindow, UsageSeries, UsageDevice
    rows = conn.execute(
        select(
            s.cluster,
            s.holder_kind,
            s.holder_uid,
            s.namespace,
            s.holder_name,
            d.mig_profile,
            w.window_start,
            w.window_seconds,
            w.used_gpu_seconds,
            w.sampled_seconds,
        )
        .select_from(
            w.__table__.join(s.__table__, s.id == w.series_id).outerjoin(
                d.__table__, d.id == s.device_id
            )
        )
        .where(
            s.cluster.in_(scope.clusters),
            s.holder_kind.in_((HOLDER_POD, HOLDER_CLAIM)),
            w.window_start >= t(lo - LEDGER_MAX_WINDOW),
            w.window_start < t(hi),
            w.window_start + w.window_seconds > t(lo),
        )
    ).all()
    if not rows:
        return []
    # the holders' allocations: owner, physical GPUs, still open
    info: dict[tuple[str, str, str], list[Any]] = {}
    a, c = Allocation, ClaimAllocation
    pod_rows = union_all(
        *(
            select(
                a.cluster,
                a.pod_uid,
                a.owner_kind,
                a.owner_name,
                a.physical_gpus,
                a.ended_at,
                a.pod_name,
            ).where(part)
            for part in scope.parts(lo, hi)
        )
    )
    for cluster, uid, kind, name, phys, ended, pod in conn.execute(pod_rows):
        entry = info.setdefault((cluster, HOLDER_POD, uid), [None, Fraction(0), False, pod])
        entry[0] = f"{kind}/{name}" if name else None
        entry[1] += Fraction(phys).limit_denominator(1000)
        entry[2] = entry[2] or ended is None
    seen: set[tuple[str, str, str]] = set()
    for cluster, uid, resource, kind, name, phys, ended, claim in conn.execute(
        select(
            c.cluster,
            c.claim_uid,
            c.resource_name,
            c.owner_kind,
            c.owner_name,
            c.physical_gpus,
            c.ended_at,
            c.claim_name,
        ).where(claim_part(scope, lo, hi))
    ):
        entry = info.setdefault((cluster, HOLDER_CLAIM, uid), [None, Fraction(0), False, claim])
        if entry[0] is None and name:
            entry[0] = f"{kind}/{name}"
        if (cluster, uid, resource) not in seen:  # a claim's devices once, however many pods
            seen.add((cluster, uid, resource))
            entry[1] += Fraction(phys).limit_denominator(1000)
        entry[2] = entry[2] or ended is None
    per: dict[tuple[tuple[str, str, str], int], list[Any]] = {}
    newest: dict[str, int] = {}
    for cluster, kind, uid, ns, name, profile, start, length, used, sampled in rows:
        key = ((str(cluster), str(kind), str(uid)), int(start))
        acc = per.setdefault(key, [str(ns), str(name), int(start) + int(length), 0.0, 0.0, 0])
        acc[3] += float(used)
        acc[4] = max(acc[4], float(sampled))
        acc[5] += _device_share(profile)  # the GPUs, where no allocation row says
        newest[str(cluster)] = max(newest.get(str(cluster), 0), int(start) + int(length))
    out = []
    for (holder, start), (ns, name, end, used, sampled, devices) in sorted(per.items()):
        owner, gpus, is_open, known = info.get(holder, [None, Fraction(0), False, None])
        gpus = gpus or Fraction(devices)
        last = min(progress.get(holder[0], newest[holder[0]]), newest[holder[0]])
        out.append(
            HolderWindow(
                holder,
                ns,
                known or name,
                owner,
                gpus,
                is_open,
                start,
                end,
                used,
                sampled,
                end >= last,
            )
        )
    return out
