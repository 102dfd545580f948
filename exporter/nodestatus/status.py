"""The node-level verdict, and our taint and condition on a Node. Pure: no Kubernetes.

exporter/nodestatus/updater.py applies them to the Node object (``--node-taint``,
``--node-condition``). Only what the exporter owns is ever changed: its one taint
(``gpuquota.io/gpu-unhealthy``) and its one condition (``GPUUnhealthy``). Every other taint
and condition is handed back exactly as the API server gave it (``timeAdded`` of the
node-lifecycle controller's taints included): the node admission policy
(deploy/components/device-plugin) compares them, and they are other controllers' business.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuquota.exporter.health.verdict import NodeHealth, State

CONDITION_TYPE = "GPUUnhealthy"
TAINT_KEY = "gpuquota.io/gpu-unhealthy"
TAINT_VALUE = "true"
TAINT_EFFECT = "NoSchedule"
TAINT_EFFECTS = ("NoSchedule", "NoExecute")  # NoExecute also evicts: opt in (docs/health.md)

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Wanted:
    unhealthy: bool
    reason: str  # CamelCase, as Kubernetes condition reasons are
    message: str


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


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
        # each device's own fence time: the condition's lastTransitionTime is the node's first
        # fence, and a device fenced later must not read as that old (gpuquota remediate's
        # --evict-after, the agent's own restore)
        when = f" since {rfc3339(device.since)}" if device.since > 0 else ""
        parts.append(f"{device.uuid} ({codes}; action {device.action.label}){when}")
    return Wanted(True, "GPUUnhealthy", f"{len(sick)} unhealthy: " + "; ".join(parts))


def taints_with(
    existing: list[Obj], unhealthy: bool, effect: str = TAINT_EFFECT
) -> list[Obj] | None:
    """Pure: the node's taint list with ours added, changed or removed; None when nothing
    changes. Other taints are the very objects of ``existing``, in their order."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect must be one of {', '.join(TAINT_EFFECTS)}, not {effect!r}")
    others = [t for t in existing if t.get("key") != TAINT_KEY]
    ours = [t for t in existing if t.get("key") == TAINT_KEY]
    if unhealthy:
        if len(ours) == 1 and (ours[0].get("effect"), ours[0].get("value")) == (
            effect,
            TAINT_VALUE,
        ):
            return None
        return [*others, {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": effect}]
    return others if ours else None


def condition_for(wanted: Wanted, existing: list[Obj], now: str) -> Obj:
    """Pure: our condition as it should be now; ``lastTransitionTime`` moves only when the
    status does (as the kubelet's own conditions do)."""
    status = "True" if wanted.unhealthy else "False"
    old = next((c for c in existing if c.get("type") == CONDITION_TYPE), None)
    since = now
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        since = old["lastTransitionTime"]
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": wanted.reason,
        "message": wanted.message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": since,
    }
