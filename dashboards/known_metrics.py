"""The metric names dashboards and alert rules may use, each from its owner's own definition.

* gpu-exporter: every family in the one metric table, exporter/expose/metrics.py.
* gpuquota controller: the families it registers, quota/controller/metrics.py.
* Prometheus itself: ``up`` and the other per-target series (gpuquota.dashboards.promql).
"""

from __future__ import annotations

from gpuquota.dashboards.promql import PROMETHEUS_SERIES


def exporter_metric_names() -> frozenset[str]:
    """Every metric the exporter emits natively (--compat rows are for foreign dashboards)."""
    from gpuquota.exporter.expose.metrics import rows

    return frozenset(spec.name for spec in rows())


def controller_metric_names() -> frozenset[str]:
    """Every series name the controller exposes (prometheus_client adds _total to counters)."""
    from gpuquota.quota.controller.metrics import ControllerMetrics

    names = set()
    for family in ControllerMetrics().registry.collect():
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return frozenset(names)


def known_metric_names() -> frozenset[str]:
    return exporter_metric_names() | controller_metric_names() | PROMETHEUS_SERIES
