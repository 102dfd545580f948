"""The metric names dashboards and alert rules may use, each from its owner's own definition.

* gpu-exporter: every family in the one metric table, exporter/expose/metrics.py.
* gpuquota controller: its metric table, quota/controller/metrics.py (tests/controller checks
  that the table is what it exposes; the ledger's rows only while it leads with a ledger).
* gpuquota remediate: its metric table, quota/remediation/metrics.py.
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
    from gpuquota.quota.controller.metrics import METRICS

    return frozenset(s.name + ("_total" if s.type == "counter" else "") for s in METRICS)


def remediation_metric_names() -> frozenset[str]:
    """Every series name `gpuquota remediate` exposes (quota/remediation/metrics.py)."""
    from gpuquota.quota.remediation.metrics import METRICS

    return frozenset(s.name + ("_total" if s.type == "counter" else "") for s in METRICS)


def known_metric_names() -> frozenset[str]:
    return (
        exporter_metric_names()
        | controller_metric_names()
        | remediation_metric_names()
        | PROMETHEUS_SERIES
    )
