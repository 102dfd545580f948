"""The report's reads of quota history and of the usage ledger, summed inside the database.

Quota: each (namespace, quota, resource) is a step function of its samples, integrated over the
window. Ledger: the usage windows' used, sampled and energy figures per series, joined to the
allocation rows by UID and grouped by the report's keys. The allocations, capacity and what the
store knows of each cluster are read apart (allocations.py, capacity.py, scope.py; the SQL
building blocks in sql.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    Float,
    Select,
    String,
    and_,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.engine import Connection

from gpuquota.quota.accounting.rules.claims import (
    ALLOCATION_PATH_DEVICE_PLUGIN,
    ALLOCATION_PATH_DRA,
)
from gpuquota.quota.report.allocations import GROUP_COLUMNS, PATH_COLUMN, claim_part, key_values
from gpuquota.quota.report.scope import Scope
from gpuquota.quota.report.sql import FAR_FUTURE, clipped, greatest, least, t
from gpuquota.quota.store.models import (
    Allocation,
    ClaimAllocation,
    LedgerProgress,
    NamespaceLabels,
    QuotaSample,
    UsageDevice,
    UsageSeries,
    UsageWindow,
)


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
        values, i = key_values([*plain, *(f"label:{k}" for k in label_keys)], r)
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
