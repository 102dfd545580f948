"""The metric names dashboards and alert rules may use, from their owners.

* gpu-exporter: every family in the one metric table, exporter/metrics.py.
* gpuquota controller: listed below with their meaning, as the controller serves them.
* Prometheus itself: ``up`` and the other per-target series (dashboards.promql).
"""

from __future__ import annotations

from dashboards.promql import PROMETHEUS_SERIES

# The quota controller's metrics that dashboards and alerts use (all gauges, per namespace).
CONTROLLER_METRICS: dict[str, str] = {
    "gpuquota_namespace_gpu_quota_hard": (
        "GPUs the namespace's ResourceQuotas allow (requests.nvidia.com/gpu hard limit)."
    ),
    "gpuquota_namespace_gpu_quota_used": "GPUs counted against those ResourceQuotas now.",
    "gpuquota_namespace_gpus_allocated": (
        'GPUs held by running pods; kind="raw" counts resources as requested, '
        'kind="physical" counts physical GPUs (time-sliced replicas as their share).'
    ),
}


def exporter_metric_names() -> frozenset[str]:
    """Every metric the exporter emits natively (--compat rows are for foreign dashboards)."""
    from exporter.metrics import rows

    return frozenset(spec.name for spec in rows())


def known_metric_names() -> frozenset[str]:
    return exporter_metric_names() | frozenset(CONTROLLER_METRICS) | PROMETHEUS_SERIES
