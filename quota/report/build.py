"""The report's core: one request in, one computed report out.

``build_report(conn, request)`` is fetch -> compute: ``fetch`` runs every query of a report on
an open connection (and asks Prometheus where the request names it) into one
:class:`Fetched`; ``compute_report`` turns that into a :class:`compute.Report` without any I/O;
the renderers (render.py, focus.py, chart.py) format it. None knows of flags. `gpuquota report` (quota/report/cli.py) parses its flags into a
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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any, Literal

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.report import compute, daily, period, query
from gpuquota.quota.report.allocations import UsageRow, best_effort_pods, usage
from gpuquota.quota.report.capacity import CapacityRow, capacity
from gpuquota.quota.report.idle import covered_spans, span_edges
from gpuquota.quota.report.idle import idle as idle_table
from gpuquota.quota.report.ratecard import RateCard
from gpuquota.quota.report.scope import GapRecord, Scope, coverage, data_begins, known_clusters
from gpuquota.quota.report.scope import gaps as recorded_gaps
from gpuquota.quota.store.db import concurrent_reads, sibling

# At most this many connections read at once (the report's own and its siblings)
READERS = 3

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
    # split it into calendar days, and where a price changes (the FOCUS export's periods)
    day_buckets: bool = False
    prometheus: str | None = None  # base URL for measured utilisation (namespace groups)
    # the label naming the cluster in that Prometheus (--prometheus-cluster-label): with
    # ``cluster``, its series only; without, every cluster's, as the store's
    prometheus_cluster_label: str = ""
    # the idle-allocations view (the usage ledger's rule): activity under the threshold for at
    # least idle_for seconds of consecutive ledger windows
    idle_allocations: bool = False
    idle_threshold: Fraction = Fraction(5, 100)
    idle_for: int = 3600


@dataclass(frozen=True)
class Fetched:
    """Everything a report is computed from, as read from the store (and Prometheus): the
    fetch step's result, the pure computation's input."""

    buckets: list[int]
    edges: list[int]
    clusters: tuple[str, ...]
    ends: dict[str, int]  # per cluster, where its data ends (heartbeat)
    begins: dict[str, int]  # per cluster, where its data begins
    usage: list[UsageRow]
    best_effort_pods: dict[str, int]
    gaps: list[GapRecord]
    quota_span: int | None  # None: the grouping has no quota view
    quota: list[query.QuotaRow]
    idle_capacity: list[CapacityRow] | None  # None: no idle table asked for
    idle_allocated: list[UsageRow]  # keyed (model, pool, cluster), over idle_edges
    # per cluster, the parts of the window the store covers (idle.covered_spans)
    covered: dict[str, list[tuple[int, int]]]
    idle_edges: list[int]  # edges cut at the covered spans' boundaries too (the idle view)
    ledger: bool  # the store has a usage ledger for the clusters in scope
    ledger_until: dict[str, int]
    ledger_rows: list[query.LedgerRow]
    ledger_cut: query.LedgerCut  # the ledger windows the period's edges cut
    unallocated_energy: dict[str, float]  # per cluster, joules of GPUs nobody held
    holder_windows: list[query.HolderWindow] | None  # None: no idle-allocations view
    pod_usage: list[UsageRow] | None  # per pod, to split Prometheus' figures
    measured: Any = None  # prometheus.Measured, when asked for
    # day buckets (FOCUS): the ledger's rows of each bucket (daily.py); None: not asked for
    ledger_days: list[list[query.LedgerRow]] | None = None


def build_report(conn: Connection, request: ReportRequest) -> compute.Report:
    """The whole report for ``request`` from the store behind ``conn``: fetch, then compute;
    ReportError when the store holds nothing that matches, or a query (or Prometheus) fails."""
    return compute_report(fetch(conn, request), request)


def _edges(request: ReportRequest) -> tuple[list[int], list[int]]:
    window, card = request.window, request.card
    buckets = (
        period.days(window)
        if request.day_buckets
        else period.buckets(window)
        if request.chart_buckets
        else [window.start, window.end]
    )
    if request.day_buckets and card is not None:
        # a FOCUS charge period has one unit price: split days where a price changes
        buckets = compute.sub_windows(
            window.start, window.end, buckets, card.boundaries(window.start, window.end)
        )
    # pricing, and the ledger's energy per bucket, need the buckets among the edges
    edges = compute.sub_windows(
        window.start, window.end, buckets, card.boundaries(window.start, window.end) if card else []
    )
    return buckets, edges


def fetch(conn: Connection, request: ReportRequest) -> Fetched:
    """Every read of the report: allocation intervals, quota history, capacity, gaps, the
    usage ledger and, where asked, Prometheus' answers. Refuses (ReportError) a cluster the
    store does not know and a window that holds no data."""
    window, now, keys = request.window, request.now, list(request.keys)
    idle = request.idle or request.spread_idle is not None
    buckets, edges = _edges(request)
    try:
        clusters = known_clusters(conn)
        if not clusters:  # an empty bill would read as "nothing used": refuse it
            raise ReportError(
                "the store holds no data yet (no cluster was ever recorded: run `gpuquota "
                "controller` or `gpuquota replay` against it first): nothing to report"
            )
        if request.cluster is not None and request.cluster not in clusters:
            known = ", ".join(repr(c) for c in clusters) or "none: the store is empty"
            raise ReportError(
                f"--cluster: no cluster {request.cluster!r} in the store (known: {known})"
            )
        scope = Scope.of(conn, request.cluster)
        ends = dict(scope.known_until)
        begins = data_begins(conn, scope.clusters)
        _check_window(window, now, ends, [c for c in scope.clusters if c in ends])
        # the latest any cluster in scope is known to (now, where one has no heartbeat)
        known_end = max(ends.values()) if ends and len(ends) == len(scope.clusters) else now
        quota_span: int | None = None
        if query.quota_applies(keys):
            # the part of the window the store knows: after the data begins (the earliest
            # cluster in scope), before it ends
            known_start = max(window.start, min(begins.values(), default=window.start))
            quota_span = max(min(window.end, now, known_end) - known_start, 0)
        gaps = recorded_gaps(conn, scope.clusters, window.start, min(window.end, now))
        # every cluster the store knows (one with nodes and no allocation yet has capacity)
        in_view = (request.cluster,) if request.cluster is not None else tuple(clusters)
        covered = covered_spans(
            in_view,
            data_begins(conn, in_view),
            {c.cluster: c.known_until for c in coverage(conn, in_view) if c.known_until},
            recorded_gaps(conn, in_view, window.start, min(window.end, now)),
            window.start,
            min(window.end, now),
        )
        idle_edges = compute.sub_windows(window.start, window.end, edges, span_edges(covered))
        ledger = query.ledger_present(conn, scope)
        if request.idle_allocations and not ledger:
            where = ", ".join(repr(c) for c in scope.clusters)
            raise ReportError(
                f"--idle-allocations: the store has no usage ledger for {where} (the node "
                "agents' per-process usage, ingested by `gpuquota controller "
                "--ledger-prometheus-url`): there is nothing to find idle allocations in"
            )
        ledger_until = query.ledger_progress(conn, scope) if ledger else {}
        pod_keys: list[str] | None = None
        if request.prometheus and list(keys) != ["namespace"]:
            pod_keys = [*keys, "pod"] if "pod" not in keys else [*keys]
        lo, hi = window.start, window.end
        # the reads a request does not ask for
        found: dict[str, Any] = {
            "ledger_rows": [],
            "ledger_cut": query.LedgerCut(),
            "unallocated_energy": {},
            "quota": [],
            "idle_allocated": [],
            "idle_capacity": None,
            "holder_windows": [] if request.idle_allocations else None,
            "pod_usage": None,
            "ledger_days": None,
        }
        # the independent reads it asks for, the heaviest first (each scans the window once)
        jobs: dict[str, Callable[[Connection], Any]] = {
            "usage": lambda c: usage(c, keys, edges, now, scope=scope)
        }
        if ledger:
            jobs["ledger_rows"] = lambda c: query.ledger(c, keys, edges, now, scope)
        if ledger and request.day_buckets:
            # one read a charge period, spread over the readers like the other reads
            jobs.update(daily.bucket_jobs(keys, buckets, now, scope))
        jobs["best_effort_pods"] = lambda c: best_effort_pods(c, scope, lo, hi, now)
        if idle:
            jobs["idle_allocated"] = lambda c: usage(
                c, ["model", "pool", "cluster"], idle_edges, now, scope=scope
            )
            jobs["idle_capacity"] = lambda c: capacity(c, idle_edges, now, request.cluster, scope)
        if pod_keys is not None:
            jobs["pod_usage"] = lambda c: usage(c, pod_keys, edges, now, scope=scope)
        # quota rows per namespace always: a group spanning namespaces adds them up in
        # compute.quota_figures (each over its own sampled time)
        quota_keys = keys if "namespace" in keys else ["namespace", *keys]
        if quota_span:
            jobs["quota"] = lambda c: query.quota(
                c, quota_keys, lo, hi, now, request.cluster, scope
            )
        if ledger and request.idle_allocations:
            jobs["holder_windows"] = lambda c: query.holder_windows(
                c, lo, hi, now, scope, ledger_until
            )
        if ledger:
            jobs["unallocated_energy"] = lambda c: query.unallocated_energy(c, lo, hi, now, scope)
            jobs["ledger_cut"] = lambda c: query.ledger_cut(c, scope, lo, hi, now)
        found.update(run_reads(conn, jobs))
        if ledger and request.day_buckets:
            found["ledger_days"] = daily.gather(found, len(buckets) - 1)
        fetched = Fetched(
            buckets=buckets,
            edges=edges,
            clusters=scope.clusters,
            ends=ends,
            begins=begins,
            quota_span=quota_span,
            ledger=ledger,
            ledger_until=ledger_until,
            gaps=gaps,
            covered=covered,
            idle_edges=idle_edges,
            **found,
        )
    except SQLAlchemyError as exc:
        raise ReportError(f"database query failed: {first_line(exc)}", 1) from exc
    if request.prometheus:
        from gpuquota.quota import promscope
        from gpuquota.quota.report import prometheus

        label = request.prometheus_cluster_label if request.cluster is not None else ""
        try:
            measured = prometheus.measure(
                request.prometheus,
                window.start,
                min(window.end, now, known_end),
                per_pod=fetched.pod_usage is not None,
                scope=promscope.Scope(label, request.cluster or ""),
            )
        except prometheus.PrometheusError as exc:
            raise ReportError(str(exc), 1 if exc.unavailable else 2) from exc
        fetched = dataclasses.replace(fetched, measured=measured)
    return fetched


def run_reads(
    conn: Connection, jobs: dict[str, Callable[[Connection], Any]], readers: int = READERS
) -> dict[str, Any]:
    """Each job's result, by name. Where the store serves reads side by side
    (``db.concurrent_reads``: PostgreSQL, whose server does the work while each thread only
    waits; a SQLite file read only, whose library works without the interpreter lock) the jobs
    run concurrently, in the order given, on ``conn`` and up to ``readers - 1`` sibling
    connections; elsewhere one after another on ``conn``. Each query has its own snapshot
    either way (PostgreSQL's READ COMMITTED, as on one connection; SQLite's readers see the
    last commit). The first error is raised once every thread has stopped."""
    names = list(jobs)
    if not concurrent_reads(conn) or readers <= 1 or len(names) <= 1:
        return {name: jobs[name](conn) for name in names}
    results: dict[str, Any] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    pending = iter(names)

    def take() -> str | None:
        with lock:
            return None if errors else next(pending, None)

    def work(c: Connection) -> None:
        while (name := take()) is not None:
            try:
                results[name] = jobs[name](c)
            except BaseException as exc:  # re-raised in the caller's thread
                with lock:
                    errors.append(exc)

    def sibling_work() -> None:
        try:
            with sibling(conn) as c:
                work(c)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [
        threading.Thread(target=sibling_work, name=f"report-read-{i}", daemon=True)
        for i in range(min(readers, len(names)) - 1)
    ]
    for thread in threads:
        thread.start()
    work(conn)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def compute_report(fetched: Fetched, request: ReportRequest) -> compute.Report:
    """The report from what ``fetch`` read: no I/O; the report comes back frozen. ReportError where the window holds no data
    (the store's data begins after it and no allocation reaches into it)."""
    window, now, keys, card = request.window, request.now, list(request.keys), request.card
    buckets, edges = fetched.buckets, fetched.edges
    ends, begins = fetched.ends, fetched.begins
    report = compute.aggregate(keys, fetched.usage, edges, card, buckets)
    report.coverage = {c: ends.get(c) for c in fetched.clusters}
    report.window_start, report.window_end = window.start, min(window.end, now)
    # a report of the present may trail a live controller's heartbeat by a flush interval
    # or so: that is now, not an end worth a note (the refusal above has no such grace)
    grace = LIVE_GRACE_SECONDS if report.window_end >= now else 0
    report.ends_early = {c: at for c, at in ends.items() if at < report.window_end - grace}
    report.begins_late = {c: at for c, at in begins.items() if at > window.start}
    if begins and all(at >= window.end for at in begins.values()) and not report.groups:
        where = ", ".join(f"{c!r} from {_when(at, window)}" for c, at in sorted(begins.items()))
        raise ReportError(
            f"no data for the period {window.label()}: the store's data begins after it ({where})"
        )
    if not report.groups and fetched.covered and not any(fetched.covered.values()):
        where = "; ".join(
            f"{c!r} from {_when(begins[c], window) if c in begins else '?'} to "
            f"{_when(ends[c], window) if c in ends else 'now'}"
            for c in sorted(fetched.covered)
        )
        raise ReportError(
            f"no data for the period {window.label()}: the store covers none of it ({where}, "
            "less recorded gaps)"
        )
    report.best_effort_pods = fetched.best_effort_pods
    report.gaps = fetched.gaps
    report.covered = fetched.covered
    if fetched.quota_span is not None:
        report.quota_span = fetched.quota_span
        report.quota = []
        if fetched.quota_span:
            report.quota, report.quota_totals = compute.quota_figures(
                fetched.quota,
                fetched.quota_span,
                keys if "namespace" in keys else ["namespace", *keys],
                "namespace" not in keys,
            )
    if fetched.idle_capacity is not None:
        report.idle = idle_table(
            fetched.idle_capacity, fetched.idle_allocated, fetched.idle_edges, card, fetched.covered
        )
        if request.day_buckets:
            report.idle_by_bucket = daily.idle_by_bucket(
                fetched.idle_capacity,
                fetched.idle_allocated,
                fetched.idle_edges,
                buckets,
                card,
                fetched.covered,
            )
    if fetched.ledger_days is not None:
        report.used_by_bucket = daily.used_by_bucket(fetched.ledger_days)
    # the usage ledger: used GPU-seconds, energy, coverage per group
    report.ledger, report.ledger_until = fetched.ledger, fetched.ledger_until
    report.ledger_cut = fetched.ledger_cut
    report.unallocated_energy = {c: Fraction(j) for c, j in fetched.unallocated_energy.items() if j}
    if fetched.ledger:
        compute.attach_ledger(report, fetched.ledger_rows, edges, card)
    if fetched.holder_windows is not None:
        report.idle_threshold, report.idle_min_seconds = request.idle_threshold, request.idle_for
        report.idle_allocations = compute.idle_runs(
            fetched.holder_windows,
            request.idle_threshold,
            request.idle_for,
            window.start,
            min(window.end, now),
            fetched.ledger_until,
        )
    if fetched.measured is not None and request.prometheus:
        from gpuquota.quota.report import prometheus

        pods = None
        if fetched.pod_usage is not None:  # the pods' physical seconds per group
            pod_keys = [*keys, "pod"] if "pod" not in keys else [*keys]
            pods = compute.aggregate(pod_keys, fetched.pod_usage, edges, card, None)
            if "pod" in keys:  # already per pod: the pod is the group's own key
                pods.groups = [
                    dataclasses.replace(g, keys=(*g.keys, g.keys[keys.index("pod")]))
                    for g in pods.groups
                ]
        prometheus.attach(report, fetched.measured, pods)
        report.prometheus = request.prometheus
    if request.spread_idle is not None:
        compute.spread_idle(report, request.spread_idle)
    if request.top is not None:
        compute.fold_top(report, request.top)
    return report.freeze()


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
