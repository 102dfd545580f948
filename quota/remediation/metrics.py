"""Prometheus metrics of ``gpuquota remediate``: one table (:data:`METRICS`), rendered into
docs/controller-metrics.md beside the controller's by quota/controller/metrics_doc.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class RemediationMetric:
    """One row of the table: the fields of the controller's (quota/controller/metrics.py), so
    one generator renders both."""

    attr: str  # the RemediationMetrics attribute
    name: str
    type: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...]
    source: str  # where the value comes from, and how often it is set


_ROUND = "after each round (every --interval)"

METRICS: tuple[RemediationMetric, ...] = (
    RemediationMetric(
        "breaker_open",
        "gpuquota_remediation_breaker_open",
        "gauge",
        "1 while the circuit breaker stops every pod action: more than --breaker-share of the "
        "GPU nodes (and at least --breaker-min-nodes) report unhealthy GPUs at once",
        (),
        "The nodes' published verdicts (Node condition, DeviceTaintRules), " + _ROUND,
    ),
    RemediationMetric(
        "gpu_nodes",
        "gpuquota_remediation_gpu_nodes",
        "gauge",
        "GPU nodes: a GPU resource in their capacity, or a verdict of their agent published",
        (),
        "The Node list and DeviceTaintRules, " + _ROUND,
    ),
    RemediationMetric(
        "reporting_nodes",
        "gpuquota_remediation_reporting_nodes",
        "gauge",
        "GPU nodes whose agent reports at least one unhealthy GPU now",
        (),
        "The Node list and DeviceTaintRules, " + _ROUND,
    ),
    RemediationMetric(
        "budget_left",
        "gpuquota_remediation_eviction_budget_left",
        "gauge",
        "Evictions the fleet-wide budget still allows in the current --evict-window",
        (),
        "The store's remediation_actions rows, " + _ROUND + " with --evict",
    ),
    RemediationMetric(
        "actions",
        "gpuquota_remediation_actions",
        "counter",
        "Pod actions by kind (evict, condition) and result (evicted, dry_run, blocked_by_pdb, "
        "refused, gone, failed, marked, cleared, skipped, dry_run_blocked, dry_run_failed)",
        ("action", "result"),
        "Each action, as it is recorded in the store",
    ),
    RemediationMetric(
        "leader",
        "gpuquota_remediation_leader",
        "gauge",
        "1 while this replica acts: it holds the Lease (--lease-name), or runs without one",
        (),
        "Set when it takes the Lease and starts its rounds, cleared when it stops",
    ),
    RemediationMetric(
        "round_errors",
        "gpuquota_remediation_round_errors",
        "counter",
        "Rounds that failed (API server or store unreachable, a refused call)",
        (),
        "Each failed round; retried at the next --interval",
    ),
)


_BY_ATTR = {spec.attr: spec for spec in METRICS}


class RemediationMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.breaker_open = self._gauge("breaker_open")
        self.gpu_nodes = self._gauge("gpu_nodes")
        self.reporting_nodes = self._gauge("reporting_nodes")
        self.budget_left = self._gauge("budget_left")
        self.actions = self._counter("actions")
        self.round_errors = self._counter("round_errors")
        self.leader = self._gauge("leader")

    def _gauge(self, attr: str) -> Gauge:
        spec = _BY_ATTR[attr]
        assert spec.type == "gauge"
        return Gauge(spec.name, spec.help, spec.labels, registry=self.registry)

    def _counter(self, attr: str) -> Counter:
        spec = _BY_ATTR[attr]
        assert spec.type == "counter"
        return Counter(spec.name, spec.help, spec.labels, registry=self.registry)
