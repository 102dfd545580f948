"""The node-level verdict and the taint list, from one ``NodeHealth``. Pure: no Kubernetes.

exporter/nodestatus/updater.py applies them to the Node object (``--node-taint``,
``--node-condition``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuquota.exporter.health.verdict import NodeHealth, State

CONDITION_TYPE = "GPUUnhealthy"
TAINT_KEY = "gpuquota.io/gpu-unhealthy"
TAINT_EFFECT = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Wanted:
    unhealthy: bool
    reason: str  # CamelCase, as Kubernetes condition reasons are
    message: str


def wanted_status(health: NodeHealth) -> Wanted:
    """Pure: the node-level verdict for one NodeHealth."""
    sick = [d for d in health.devices if d.state is State.UNHEALTHY]
    if not sick:
        return Wanted(
            False,
            "AllGPUsHealthy",
            f"all {len(health.devices)} GPU devices are healthy or degraded",
        )
    parts = []
    for device in sick:
        codes = ",".join(r.code for r in device.reasons if r.state is State.UNHEALTHY)
        parts.append(f"{device.uuid} ({codes}; action {device.action.label})")
    return Wanted(True, "GPUUnhealthy", f"{len(sick)} unhealthy: " + "; ".join(parts))


def taints_with(existing: list[dict[str, Any]], unhealthy: bool) -> list[dict[str, Any]] | None:
    """Pure: the node's taint list with ours added or removed; None when nothing changes."""
    others = [t for t in existing if t.get("key") != TAINT_KEY]
    ours = [t for t in existing if t.get("key") == TAINT_KEY]
    if unhealthy:
        if ours and all(t.get("effect") == TAINT_EFFECT for t in ours):
            return None
        return [*others, {"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}]
    return others if ours else None
