"""The allocations read: allocated seconds per group and sub-window, summed inside the database.

Device-plugin allocations and DRA claim pieces (or, grouped by a pod-level key, each pod's
equal share of a shared claim's time) come in as one UNION ALL over the scope's index ranges;
``SUM ... GROUP BY`` returns one row per group and price class (model, resource, units,
physical share), and only those rows reach Python (compute.aggregate). Also the BestEffort-pod
check, which reads the same allocations.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Integer,
    Select,
    String,
    and_,
    case,
    cast,
    column,
    func,
    literal,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import Connection

from gpuquota.quota.accounting.rules.claims import (
    ALLOCATION_PATH_DEVICE_PLUGIN,
    ALLOCATION_PATH_DRA,
)
from gpuquota.quota.report.scope import Scope
from gpuquota.quota.report.sql import FAR_FUTURE, clipped, greatest, least, t
from gpuquota.quota.store.models import (
    BEST_EFFORT_SQL,
    Allocation,
    ClaimAllocation,
    NamespaceLabels,
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


def key_values(keys: Sequence[str], row: Sequence[Any]) -> tuple[tuple[str | None, ...], int]:
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
    values, i = key_values(keys, r)
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
