"""The report's core: one request in, one computed report out.

``build_report(conn, request)`` runs every query of a report on an open connection (and asks
Prometheus where the request names it) and returns a :class:`compute.Report`; it knows nothing
of flags or output formats. `gpuquota report` (quota/report/cli.py) parses its flags into a
:class:`ReportRequest`, opens the store, calls this, and renders.

Missing data is never shown as zero, and one rule says what is missing whatever its distance
from the data: each cluster's data covers [the first time the store knew it, the last time it
knew it] (its clusters row and its heartbeat). A window wholly outside that, for every cluster
in scope, raises ReportError naming what the store does hold (before the data begins: unless
allocations already running then reach into it); a window that reaches past either edge gets a
note saying which part is not covered. Open intervals count only up to the data's end.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Literal

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.report import compute, period, query
from gpuquota.quota.report.ratecard import RateCard

# How old a live controller's heartbeat can be (a few flush intervals) in a report of the
# present before the report notes that the data ends early.
LIVE_GRACE_SECONDS = 600


class ReportError(Exception):
    """Bad input or no matching data (status 2), or a dependency that does not answer
    (status 1): one line for stderr."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ReportRequest:
    """Everything a report is computed from, already parsed and checked."""

    window: period.Period
    now: int  # unix seconds taken as now: nothing after it is counted
    keys: tuple[str, ...] = ("namespace",)
    cluster: str | None = None  # None: every cluster in the store
    card: RateCard | None = None
    idle: bool = False
    spread_idle: Literal["proportional", "even"] | None = None
    top: int | None = None  # keep the N largest groups, fold the rest into (other)
    chart_buckets: bool = False  # split the window into calendar buckets for a chart
    day_buckets: bool = False  # split it into calendar days (the FOCUS export's periods)
    prometheus: str | None = None  # base URL for measured utilisation (namespace groups)
    # the idle-allocations view (the usage ledger's rule): activity under the threshold for at
    # least idle_for seconds of consecutive ledger windows
    idle_allocations: bool = False
    idle_threshold: Fraction = Fraction(5, 100)
    idle_for: int = 3600


def build_report(conn: Connection, request: ReportRequest) -> compute.Report:
    """The whole report for ``request`` from the store behind ``conn``; ReportError when the
    store holds nothing that matches, or a query (or Prometheus) fails."""
    window, now, keys, card = request.window, request.now, list(request.keys), request.card
    idle = request.idle or request.spread_idle is not None
    buckets = (
        period.days(window)
        if request.day_buckets
        else period.buckets(window)
        if request.chart_buckets
        else [window.start, window.end]
    )
    edges = compute.sub_windows(
        window.start, window.end, buckets, card.boundaries(window.start, window.end) if card else []
    )  # pricing, and the ledger's energy per bucket, need the buckets among the edges
    try:
        clusters = query.known_clusters(conn)
        if request.cluster is not None and request.cluster not in clusters:
            known = ", ".join(repr(c) for c in clusters) or "none: the store is empty"
            raise ReportError(
                f"--cluster: no cluster {request.cluster!r} in the store (known: {known})"
            )
        scope = query.Scope.of(conn, request.cluster)
        ends = dict(scope.known_until)
        begins = query.data_begins(conn, scope.clusters)
        _check_window(window, now, ends, [c for c in scope.clusters if c in ends])
        # the latest any cluster in scope is known to (now, where one has no heartbeat)
        known_end = max(ends.values()) if ends and len(ends) == len(scope.clusters) else now
        rows = query.usage(conn, keys, edges, now, scope=scope)
        report = compute.aggregate(keys, rows, edges, card, buckets)
        report.coverage = {c: ends.get(c) for c in scope.clusters}
        report.window_end = min(window.end, now)
        # a report of the present may trail a live controller's heartbeat by a flush interval
        # or so: that is now, not an end worth a note (the refusal above has no such grace)
        grace = LIVE_GRACE_SECONDS if report.window_end >= now else 0
        report.ends_early = {c: at for c, at in ends.items() if at < report.window_end - grace}
        report.begins_late = {c: at for c, at in begins.items() if at > window.start}
        if begins and all(at >= window.end for at in begins.values()) and not report.groups:
            where = ", ".join(f"{c!r} from {_when(at, window)}" for c, at in sorted(begins.items()))
            raise ReportError(
                f"no data for the period {window.label()}: the store's data begins after it "
                f"({where})"
            )
        # the usage ledger: used GPU-seconds, energy, coverage per group
        report.ledger = query.ledger_present(conn, scope)
        if report.ledger:
            report.ledger_until = query.ledger_progress(conn, scope)
            compute.attach_ledger(report, query.ledger(conn, keys, edges, now, scope), edges, card)
        if request.idle_allocations:
            report.idle_threshold, report.idle_min_seconds = (
                request.idle_threshold,
                request.idle_for,
            )
            windows = (
                query.holder_windows(
                    conn, window.start, window.end, now, scope, report.ledger_until
                )
                if report.ledger
                else []
            )
            report.idle_allocations = compute.idle_runs(
                windows,
                request.idle_threshold,
                request.idle_for,
                window.start,
                min(window.end, now),
            )
        report.best_effort_pods = query.best_effort_pods(conn, scope, window.start, window.end, now)
        report.gaps = query.gaps(conn, scope.clusters, window.start, min(window.end, now))
        if query.quota_applies(keys):
            # averages are over the part of the window the store knows
            span = max(min(window.end, now, known_end) - window.start, 0)
            report.quota_span = span
            report.quota = (
                compute.quota_figures(
                    query.quota(conn, keys, window.start, window.end, now, request.cluster, scope),
                    span,
                )
                if span
                else []
            )
        if idle:
            alloc = query.usage(conn, ["model", "pool"], edges, now, scope=scope)
            report.idle = compute.idle(
                query.capacity(conn, edges, now, request.cluster, scope), alloc, edges, card
            )
    except SQLAlchemyError as exc:
        raise ReportError(f"database query failed: {first_line(exc)}", 1) from exc
    if request.prometheus:
        from gpuquota.quota.report import prometheus

        per_pod = list(keys) != ["namespace"]
        pods = None
        if per_pod:  # the pods' physical seconds per group, to split their measured figures
            pod_keys = [*keys, "pod"] if "pod" not in keys else [*keys]
            try:
                pod_rows = query.usage(conn, pod_keys, edges, now, scope=scope)
            except SQLAlchemyError as exc:
                raise ReportError(f"database query failed: {first_line(exc)}", 1) from exc
            pods = compute.aggregate(pod_keys, pod_rows, edges, card, None)
            if "pod" in keys:  # already per pod: the pod is the group's own key
                pods.groups = [
                    dataclasses.replace(g, keys=(*g.keys, g.keys[keys.index("pod")]))
                    for g in pods.groups
                ]
        try:
            measured = prometheus.measure(
                request.prometheus, window.start, min(window.end, now, known_end), per_pod=per_pod
            )
        except prometheus.PrometheusError as exc:
            raise ReportError(str(exc), 1 if exc.unavailable else 2) from exc
        prometheus.attach(report, measured, pods)
        report.prometheus = request.prometheus
    if request.spread_idle is not None:
        compute.spread_idle(report, request.spread_idle)
    if request.top is not None:
        compute.fold_top(report, request.top)
    return report


def _check_window(
    window: period.Period, now: int, ends: dict[str, int], clusters: list[str]
) -> None:
    """Refuse a window that holds no data at all: after now, or after every cluster's end."""
    if window.start >= now:
        raise ReportError(
            f"the period {window.label()} starts after now ({_when(now, window)}): "
            "there is no data for it yet"
        )
    # the same rule however close the data's end is (a live controller's heartbeat is seconds
    # old): a window that starts at or after it holds no data yet
    if clusters and all(ends[c] <= window.start for c in clusters):
        where = ", ".join(f"{c!r} up to {_when(ends[c], window)}" for c in clusters)
        raise ReportError(
            f"no data for the period {window.label()}: the store's data ends before it ({where})"
        )


def _when(t: int, window: period.Period) -> str:
    return datetime.fromtimestamp(t, window.tz).isoformat()


def first_line(exc: BaseException) -> str:
    message = str(getattr(exc, "orig", None) or exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__
