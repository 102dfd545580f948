"""Prometheus metrics of the controller: namespace GPU quota and allocation, and its health."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ControllerMetrics:
    """Every metric the controller exposes, on its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.quota_hard = Gauge(
            "gpuquota_namespace_gpu_quota_hard",
            "ResourceQuota hard limit of a GPU resource (status.hard)",
            ["namespace", "resource", "quota"],
            registry=r,
        )
        self.quota_used = Gauge(
            "gpuquota_namespace_gpu_quota_used",
            "ResourceQuota use of a GPU resource as the quota controller counts it (status.used)",
            ["namespace", "resource", "quota"],
            registry=r,
        )
        self.allocated = Gauge(
            "gpuquota_namespace_gpus_allocated",
            "GPUs bound to the namespace's running pods now: raw units, or physical-GPU equivalents",
            ["namespace", "resource", "kind"],
            registry=r,
        )
        self.best_effort = Gauge(
            "gpuquota_namespace_best_effort_gpu_pods",
            "Live pods that request GPUs but are BestEffort (QoS looks only at cpu and memory), "
            "so NotBestEffort-scoped quotas do not count them",
            ["namespace"],
            registry=r,
        )
        self.events = Counter(
            "gpuquota_controller_events",
            "Watch events applied, by object kind and event type",
            ["kind", "type"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "gpuquota_controller_watch_restarts",
            "Watches restarted, by kind and reason (timeout, stalled, error)",
            ["kind", "reason"],
            registry=r,
        )
        self.relists = Counter(
            "gpuquota_controller_relists",
            "Full lists after the first one (410 Gone or a resume that could not continue)",
            ["kind"],
            registry=r,
        )
        self.db_errors = Counter(
            "gpuquota_controller_database_errors", "Failed writes to the store", registry=r
        )
        self.flush_lag = Gauge(
            "gpuquota_controller_flush_lag_seconds",
            "Seconds since the last successful write to the store",
            registry=r,
        )
        self.last_flush = Gauge(
            "gpuquota_controller_last_flush_timestamp_seconds",
            "Unix time of the last successful write to the store",
            registry=r,
        )
        self.pending_rows = Gauge(
            "gpuquota_controller_pending_rows",
            "Rows kept unwritten while the store fails (0 after a successful write)",
            registry=r,
        )
        self.leader = Gauge(
            "gpuquota_controller_leader",
            "1 while this replica holds the lease and writes",
            registry=r,
        )
        self.synced = Gauge(
            "gpuquota_controller_synced",
            "1 once every kind has been listed and is watched",
            registry=r,
        )
        self.sync_seconds = Gauge(
            "gpuquota_controller_sync_duration_seconds",
            "Seconds from start (or taking the lease) to synced",
            registry=r,
        )
        self.ignored = Counter(
            "gpuquota_controller_ignored_objects",
            "Objects dropped on arrival because the accounting ignores them (pods without GPUs)",
            ["kind"],
            registry=r,
        )
        self.dra_allocated = Gauge(
            "gpuquota_namespace_dra_gpus_allocated",
            "GPUs the namespace's DRA ResourceClaims hold for running pods now, per device "
            "class: raw devices, or physical-GPU equivalents",
            ["namespace", "device_class", "kind"],
            registry=r,
        )
        self.dra_watched = Gauge(
            "gpuquota_controller_dra_watched",
            "1 while ResourceClaims, ResourceSlices and DeviceClasses are watched; 0 where the "
            "cluster does not serve resource.k8s.io/v1 or RBAC forbids it",
            registry=r,
        )
        self.dra_problems = Counter(
            "gpuquota_controller_dra_problems",
            "DRA objects accounted with less than they should say: a result of a driver that "
            "is not a GPU driver (driver), a device no slice lists (device), a slice gone under "
            "allocated claims (slice_gone)",
            ["reason"],
            registry=r,
        )
        self.accounting_errors = Counter(
            "gpuquota_controller_accounting_errors",
            "Objects the accounting rules could not read (skipped)",
            ["kind"],
            registry=r,
        )
