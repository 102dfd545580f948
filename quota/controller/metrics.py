"""Prometheus metrics of the controller: namespace GPU quota and allocation, and its health.

One table (:data:`METRICS`) says every metric's name, type, labels, meaning and where and how
often its value comes from; :class:`ControllerMetrics` builds the collectors from it and
quota/controller/metrics_doc.py generates docs/controller-metrics.md from it.

Two kinds of rows. The controller's own health (events, flushes, watches) is pushed where it
happens. The quota, allocation and DRA rows (``scraped``) are facts the Accountant already
keeps: :class:`AccountantFacts`, a prometheus_client custom collector, reads them when
Prometheus scrapes (client_python's pattern for state that lives elsewhere), so a quota or a
namespace that goes away has no series to remove and nothing is kept twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # the type only: nothing here calls into the accounting but through it
    from gpuquota.quota.accounting.accountant import Accountant
    from gpuquota.quota.ledger.ingest import LedgerFacts


@dataclass(frozen=True)
class ControllerMetric:
    attr: str  # the ControllerMetrics attribute
    name: str
    type: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...]
    source: str  # where the value comes from, and how often it is set
    scraped: bool = False  # read from the Accountant at each scrape (AccountantFacts)
    ledger: bool = False  # read from the ledger's ingester at each scrape (LedgerFactsCollector)


_SCRAPED = "read from the Accountant at each scrape"
_LEDGER = (
    "read from the usage ledger's ingester (leader only, --ledger-prometheus-url) at each scrape"
)
_AFTER_FLUSH = "after each successful flush (every --flush-interval, or --flush-every events)"

METRICS: tuple[ControllerMetric, ...] = (
    ControllerMetric(
        "quota_hard",
        "gpuquota_namespace_gpu_quota_hard",
        "gauge",
        "ResourceQuota hard limit of a GPU resource (status.hard)",
        ("namespace", "resource", "quota"),
        "The Accountant's reading of each live ResourceQuota (status.hard, else spec.hard; "
        "NaN where unset), " + _SCRAPED,
        scraped=True,
    ),
    ControllerMetric(
        "quota_used",
        "gpuquota_namespace_gpu_quota_used",
        "gauge",
        "ResourceQuota use of a GPU resource as the quota controller counts it (status.used)",
        ("namespace", "resource", "quota"),
        "The Accountant's reading of each live ResourceQuota (status.used; 0 where unset), "
        + _SCRAPED,
        scraped=True,
    ),
    ControllerMetric(
        "allocated",
        "gpuquota_namespace_gpus_allocated",
        "gauge",
        "GPUs bound to the namespace's running pods now: raw units, or physical-GPU equivalents",
        ("namespace", "resource", "kind"),
        "The Accountant's open allocations (as the next flush would write them), " + _SCRAPED,
        scraped=True,
    ),
    ControllerMetric(
        "best_effort",
        "gpuquota_namespace_best_effort_gpu_pods",
        "gauge",
        "Live pods that request GPUs but are BestEffort (QoS looks only at cpu and memory), "
        "so NotBestEffort-scoped quotas do not count them",
        ("namespace",),
        "The Accountant's live pods, " + _SCRAPED,
        scraped=True,
    ),
    ControllerMetric(
        "events",
        "gpuquota_controller_events",
        "counter",
        "Watch events applied, by object kind and event type",
        ("kind", "type"),
        "Each watch event as it is applied (or dropped on arrival)",
    ),
    ControllerMetric(
        "watch_restarts",
        "gpuquota_controller_watch_restarts",
        "counter",
        "Watches restarted, by kind and reason (timeout: the server ended it, as it does at "
        "timeoutSeconds; stalled: the client's last-resort read timeout; error)",
        ("kind", "reason"),
        "Each end of a watch request",
    ),
    ControllerMetric(
        "relists",
        "gpuquota_controller_relists",
        "counter",
        "Full lists after the first one (410 Gone or a resume that could not continue)",
        ("kind",),
        "Each full list after the first",
    ),
    ControllerMetric(
        "gaps",
        "gpuquota_controller_gaps",
        "counter",
        "Gaps recorded, by kind and reason (gone: a relist after 410 Gone; restart: downtime "
        "the resumed watch could not replay): objects created and deleted inside one may be "
        "missing from reports",
        ("kind", "reason"),
        "Each gap the Accountant records (the gaps table)",
    ),
    ControllerMetric(
        "db_errors",
        "gpuquota_controller_database_errors",
        "counter",
        "Failed writes to the store",
        (),
        "Each failed flush",
    ),
    ControllerMetric(
        "flush_lag",
        "gpuquota_controller_flush_lag_seconds",
        "gauge",
        "Seconds since the last successful write to the store",
        (),
        "Wall clock minus the last successful flush, every loop turn (at least every 0.2 s)",
    ),
    ControllerMetric(
        "last_flush",
        "gpuquota_controller_last_flush_timestamp_seconds",
        "gauge",
        "Unix time of the last successful write to the store",
        (),
        _AFTER_FLUSH.capitalize(),
    ),
    ControllerMetric(
        "pending_rows",
        "gpuquota_controller_pending_rows",
        "gauge",
        "Rows kept unwritten while the store fails (0 after a successful write)",
        (),
        "Each flush: the Accountant's pending rows",
    ),
    ControllerMetric(
        "leader",
        "gpuquota_controller_leader",
        "gauge",
        "1 while this replica holds the lease and writes",
        (),
        "When the Lease is taken or lost",
    ),
    ControllerMetric(
        "synced",
        "gpuquota_controller_synced",
        "gauge",
        "1 while every kind is proven current (listed, or its resumed watch proven) and "
        "watched; 0 after a restart until then, and during a relist after 410 Gone",
        (),
        "After each flush",
    ),
    ControllerMetric(
        "sync_seconds",
        "gpuquota_controller_sync_duration_seconds",
        "gauge",
        "Seconds from start (or taking the lease) to synced",
        (),
        "Once, with gpuquota_controller_synced",
    ),
    ControllerMetric(
        "ignored",
        "gpuquota_controller_ignored_objects",
        "counter",
        "Objects dropped on arrival because the accounting ignores them (pods without GPUs)",
        ("kind",),
        "Each object a watch loop drops before queueing it",
    ),
    ControllerMetric(
        "dra_allocated",
        "gpuquota_namespace_dra_gpus_allocated",
        "gauge",
        "GPUs the namespace's DRA ResourceClaims hold for running pods now, per device class: "
        "raw devices, or physical-GPU equivalents (a claim shared by several pods once)",
        ("namespace", "device_class", "kind"),
        "The claim tracker's open claim rows, " + _SCRAPED,
        scraped=True,
    ),
    ControllerMetric(
        "dra_watched",
        "gpuquota_controller_dra_watched",
        "gauge",
        "1 while ResourceClaims, ResourceSlices and DeviceClasses are watched; 0 where the "
        "cluster serves no resource.k8s.io claims or RBAC forbids them",
        (),
        "Once, at start (and on taking the lease)",
    ),
    ControllerMetric(
        "dra_problems",
        "gpuquota_controller_dra_problems",
        "counter",
        "DRA results accounted with less than they should say: of a driver that is not a GPU "
        "driver (driver), naming a device no slice lists (device), a slice gone under held "
        "claims (slice_gone)",
        ("reason",),
        "The claim tracker's counts (once per claim and reason), " + _SCRAPED,
        scraped=True,
    ),
    ControllerMetric(
        "accounting_errors",
        "gpuquota_controller_accounting_errors",
        "counter",
        "Objects the accounting rules could not read (skipped)",
        ("kind",),
        "Each object the Accountant rejects",
    ),
    ControllerMetric(
        "ledger_ingested_until",
        "gpuquota_ledger_ingested_until_timestamp_seconds",
        "gauge",
        "Unix time up to which the usage ledger is ingested: every window that ends by then "
        "has its rows in the store",
        (),
        "ledger_progress after each ingested window, " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "ledger_rolled_until",
        "gpuquota_ledger_rolled_up_until_timestamp_seconds",
        "gauge",
        "Unix time up to which the usage ledger's window rows are rolled up into day rows "
        "(--ledger-rollup-after): windows before it are final",
        (),
        "ledger_progress after each day rolled up, " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "ledger_windows",
        "gpuquota_ledger_windows_ingested",
        "counter",
        "Usage ledger windows ingested (again, for late samples within --ledger-lookback)",
        (),
        "Each window written, " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "ledger_errors",
        "gpuquota_ledger_errors",
        "counter",
        "Failed ledger turns, by reason: prometheus (unreachable or a failed query), store, "
        "internal; each is retried with backoff",
        ("reason",),
        "Each failed turn, " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "idle_gpus",
        "gpuquota_idle_allocation_gpus",
        "gauge",
        "Physical GPUs of an open allocation (a pod's, or a DRA claim's: kind) whose activity "
        "stayed under --idle-threshold for at least --idle-for of ingested windows: a "
        "candidate to reclaim, nothing is evicted",
        ("namespace", "kind", "name"),
        "Recomputed from the ledger after each ingest, " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "idle_since",
        "gpuquota_idle_allocation_since_timestamp_seconds",
        "gauge",
        "Unix time since when an idle allocation has been idle (its first idle window, or its "
        "start; traced back at most 7 days)",
        ("namespace", "kind", "name"),
        "Recomputed from the ledger after each ingest, " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "fleet_gpu_fences",
        "gpuquota_fleet_gpu_fences",
        "gauge",
        "Fences (changes into unhealthy) of a GPU, by board serial, in the 7 days of fleet "
        "history before its ingested end; GPUs fenced at least once",
        ("serial", "model", "node"),
        "The fleet history after each ingest (quota/fleet), " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "fleet_gpu_relapses",
        "gpuquota_fleet_gpu_relapses",
        "gauge",
        "Relapses of a GPU, by board serial, in the 7 days of fleet history before its "
        "ingested end: fences within --relapse-within of its release; GPUs that relapsed",
        ("serial", "model", "node"),
        "The fleet history after each ingest (quota/fleet), " + _LEDGER,
        ledger=True,
    ),
    ControllerMetric(
        "idle_gpu_seconds",
        "gpuquota_idle_allocation_idle_gpu_seconds",
        "gauge",
        "Idle physical GPU-seconds of an idle allocation since it became idle: allocated "
        "minus used",
        ("namespace", "kind", "name"),
        "Recomputed from the ledger after each ingest, " + _LEDGER,
        ledger=True,
    ),
)


Sample = tuple[tuple[str, ...], float]  # label values, value


def facts_samples(acct: Accountant) -> dict[str, list[Sample]]:
    """The scraped rows' samples (by table attr) from the Accountant's facts: pure reads."""
    out: dict[str, list[Sample]] = {s.attr: [] for s in METRICS if s.scraped}
    for facts in acct.quota_figures():
        for fig in facts.figures:
            labels = (facts.namespace, fig.resource_name, facts.name)
            out["quota_hard"].append((labels, fig.hard if fig.hard is not None else float("nan")))
            out["quota_used"].append((labels, fig.used if fig.used is not None else 0.0))
    out["allocated"] = _per_kind(acct.open_allocations())
    out["dra_allocated"] = _per_kind(acct.claims.open_rows())
    best_effort: dict[str, int] = {}
    for namespace, _pod in acct.best_effort_gpu_pods():
        best_effort[namespace] = best_effort.get(namespace, 0) + 1
    out["best_effort"] = [((ns,), float(n)) for ns, n in sorted(best_effort.items())]
    out["dra_problems"] = [((r,), float(n)) for r, n in sorted(acct.claims.problems.items())]
    return out


class _Held(Protocol):
    """An open allocation row: a pod's (AllocationRow) or a claim's (ClaimAllocationRow)."""

    @property
    def namespace(self) -> str: ...
    @property
    def resource_name(self) -> str: ...
    @property
    def raw_units(self) -> int: ...
    @property
    def physical_gpus(self) -> float: ...


def _per_kind(rows: Iterable[_Held]) -> list[Sample]:
    """(namespace, resource, raw|physical) sums over open allocation rows."""
    raw: dict[tuple[str, str], float] = {}
    physical: dict[tuple[str, str], float] = {}
    for row in rows:
        key = (row.namespace, row.resource_name)
        raw[key] = raw.get(key, 0.0) + row.raw_units
        physical[key] = physical.get(key, 0.0) + row.physical_gpus
    return [
        sample
        for (ns, res), units in sorted(raw.items())
        for sample in (((ns, res, "raw"), units), ((ns, res, "physical"), physical[(ns, res)]))
    ]


class AccountantFacts(Collector):
    """The scraped rows, read from the controller's Accountant whenever the registry is
    collected. The controller thread holds ``lock`` while it changes the Accountant; a scrape
    that cannot have it within LOCK_WAIT_S (a store write that hangs) answers the facts of
    the previous scrape rather than hang or drop the series."""

    LOCK_WAIT_S = 1.0

    def __init__(self) -> None:
        self._source: tuple[Accountant, threading.Lock] | None = None
        self._last: dict[str, list[Sample]] = {}

    def read_from(self, acct: Accountant, lock: threading.Lock) -> None:
        """Scrapes read `acct` from now on (the Accountant of this lease term)."""
        self._source, self._last = (acct, lock), {}

    def collect(self) -> Iterator[Metric]:
        source = self._source
        if source is not None and source[1].acquire(timeout=self.LOCK_WAIT_S):
            try:
                self._last = facts_samples(source[0])
            finally:
                source[1].release()
        yield from _families([s for s in METRICS if s.scraped], self._last)


def ledger_samples(facts: LedgerFacts) -> dict[str, list[Sample]]:
    """The ledger rows' samples (by table attr) from the ingester's facts: pure reads."""
    out: dict[str, list[Sample]] = {s.attr: [] for s in METRICS if s.ledger}
    if facts.ingested_until is not None:
        out["ledger_ingested_until"] = [((), float(facts.ingested_until))]
    if facts.rolled_until is not None:
        out["ledger_rolled_until"] = [((), float(facts.rolled_until))]
    out["ledger_windows"] = [((), float(facts.windows))]
    out["ledger_errors"] = [((r,), float(n)) for r, n in sorted(facts.errors.items())]
    for idle in facts.idle:
        labels = (idle.namespace, idle.kind, idle.name)
        out["idle_gpus"].append((labels, idle.physical_gpus))
        out["idle_since"].append((labels, float(idle.since)))
        out["idle_gpu_seconds"].append((labels, idle.idle_gpu_seconds))
    for attr, samples in facts.extra.items():
        if attr in out:
            out[attr] = list(samples)
    return out


def _families(
    rows: Iterable[ControllerMetric], samples: dict[str, list[Sample]]
) -> Iterator[Metric]:
    for spec in rows:
        family: GaugeMetricFamily | CounterMetricFamily = (
            GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            if spec.type == "gauge"
            else CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        )
        for labels, value in samples.get(spec.attr, ()):
            family.add_metric(list(labels), value)
        yield family


class LedgerFactsCollector(Collector):
    """The ledger rows, read from the leader's ingester whenever the registry is collected
    (its facts are replaced whole, never changed in place: no lock). No ingester (a standby,
    the ledger off): no ledger series at all."""

    def __init__(self) -> None:
        self._source: Callable[[], LedgerFacts | None] = lambda: None

    def read_from(self, source: Callable[[], LedgerFacts | None]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        facts = self._source()
        if facts is None:
            return
        yield from _families([s for s in METRICS if s.ledger], ledger_samples(facts))


class ControllerMetrics:
    """Every metric the controller exposes, on its own registry (built from METRICS)."""

    events: Counter
    watch_restarts: Counter
    relists: Counter
    gaps: Counter
    db_errors: Counter
    flush_lag: Gauge
    last_flush: Gauge
    pending_rows: Gauge
    leader: Gauge
    synced: Gauge
    sync_seconds: Gauge
    ignored: Counter
    dra_watched: Gauge
    accounting_errors: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.facts = AccountantFacts()
        self.registry.register(self.facts)
        self.ledger = LedgerFactsCollector()
        self.registry.register(self.ledger)
        for spec in METRICS:
            if spec.scraped or spec.ledger:
                continue
            collector = Gauge if spec.type == "gauge" else Counter
            setattr(
                self,
                spec.attr,
                collector(spec.name, spec.help, list(spec.labels), registry=self.registry),
            )
