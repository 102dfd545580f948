"""Prometheus metrics of the controller: namespace GPU quota and allocation, and its health.

One table (:data:`METRICS`) says every metric's name, type, labels, meaning and where and how
often its value comes from; :class:`ControllerMetrics` builds the collectors from it and
quota/controller/metrics_doc.py generates docs/controller-metrics.md from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class ControllerMetric:
    attr: str  # the ControllerMetrics attribute
    name: str
    type: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...]
    source: str  # where the value comes from, and how often it is set


_AFTER_FLUSH = "after each successful flush (every --flush-interval, or --flush-every events)"

METRICS: tuple[ControllerMetric, ...] = (
    ControllerMetric(
        "quota_hard",
        "gpuquota_namespace_gpu_quota_hard",
        "gauge",
        "ResourceQuota hard limit of a GPU resource (status.hard)",
        ("namespace", "resource", "quota"),
        "The Accountant's reading of each live ResourceQuota (status.hard, else spec.hard; "
        "NaN where unset), when a quota event or list changes it",
    ),
    ControllerMetric(
        "quota_used",
        "gpuquota_namespace_gpu_quota_used",
        "gauge",
        "ResourceQuota use of a GPU resource as the quota controller counts it (status.used)",
        ("namespace", "resource", "quota"),
        "The Accountant's reading of each live ResourceQuota (status.used; 0 where unset), "
        "when a quota event or list changes it",
    ),
    ControllerMetric(
        "allocated",
        "gpuquota_namespace_gpus_allocated",
        "gauge",
        "GPUs bound to the namespace's running pods now: raw units, or physical-GPU equivalents",
        ("namespace", "resource", "kind"),
        "The Accountant's open allocations, " + _AFTER_FLUSH + "; at most every 5 s while "
        "the event queue is busy",
    ),
    ControllerMetric(
        "best_effort",
        "gpuquota_namespace_best_effort_gpu_pods",
        "gauge",
        "Live pods that request GPUs but are BestEffort (QoS looks only at cpu and memory), "
        "so NotBestEffort-scoped quotas do not count them",
        ("namespace",),
        "The Accountant's live pods, with gpuquota_namespace_gpus_allocated",
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
        "The claim tracker's open claim rows, with gpuquota_namespace_gpus_allocated",
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
        "The claim tracker's counts (once per claim and reason), "
        + _AFTER_FLUSH.replace("after", "read after"),
    ),
    ControllerMetric(
        "accounting_errors",
        "gpuquota_controller_accounting_errors",
        "counter",
        "Objects the accounting rules could not read (skipped)",
        ("kind",),
        "Each object the Accountant rejects",
    ),
)


class ControllerMetrics:
    """Every metric the controller exposes, on its own registry (built from METRICS)."""

    quota_hard: Gauge
    quota_used: Gauge
    allocated: Gauge
    best_effort: Gauge
    events: Counter
    watch_restarts: Counter
    relists: Counter
    db_errors: Counter
    flush_lag: Gauge
    last_flush: Gauge
    pending_rows: Gauge
    leader: Gauge
    synced: Gauge
    sync_seconds: Gauge
    ignored: Counter
    dra_allocated: Gauge
    dra_watched: Gauge
    dra_problems: Counter
    accounting_errors: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for spec in METRICS:
            collector = Gauge if spec.type == "gauge" else Counter
            setattr(
                self,
                spec.attr,
                collector(spec.name, spec.help, list(spec.labels), registry=self.registry),
            )
