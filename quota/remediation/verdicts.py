"""The node agents' published verdicts, read back: which devices of which node are fenced. Pure.

The agent decides; what it publishes is the only input here, read with the agent's own parsers
so the format has one owner:

* its Node condition ``GPUUnhealthy`` (with or without its taint): every unhealthy GPU or MIG
  instance by UUID, with its reason codes and action (exporter/nodestatus/updater.fences_of);
* its DeviceTaintRules (labels ``app.kubernetes.io/managed-by=gpuquota-exporter`` and
  ``gpuquota.io/node=<node>``): one per unhealthy DRA device, the UUID, reasons and action in
  annotations, the DRA device (driver/pool/device) in ``spec.deviceSelector``
  (exporter/dra/taintrules.fences_of).

A GPU node is one whose capacity offers a GPU resource, that carries the label
``nvidia.com/gpu.present=true`` (the agent's DaemonSet runs there; DRA nodes offer no
resource in their capacity), or whose agent has published a verdict (our condition, whatever
its status, or a rule naming it): the circuit breaker's denominator.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuquota.exporter.dra.taintrules import MANAGED_BY, MANAGER, NODE_LABEL
from gpuquota.exporter.dra.taintrules import fences_of as rule_fences
from gpuquota.exporter.health.verdict import Action
from gpuquota.exporter.nodestatus.status import CONDITION_TYPE
from gpuquota.exporter.nodestatus.updater import fences_of as node_fences

Obj = dict[str, Any]
# the actions that no restart of the application clears: its pods are acted on
NEEDS_ACTION = (Action.RESET_GPU, Action.REBOOT_NODE)
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
GPU_NODE_LABEL = (
    "nvidia.com/gpu.present"  # GPU feature discovery's; the agent's DaemonSet selects it
)

DraId = tuple[str, str, str]  # driver, pool, device


@dataclass(frozen=True, slots=True)
class FencedDevice:
    """One device a node agent says is unhealthy."""

    node: str
    uuid: str  # GPU- or MIG- UUID
    action: Action
    reasons: str  # reason codes, comma-separated (xid_79, nvml_unavailable, ...)
    since: float  # unix time the agent fenced it
    dra: DraId | None = None  # the DRA device its rule selects, if any

    @property
    def acted_on(self) -> bool:
        """Its pods are to be marked or evicted (a reset or a reboot is needed)."""
        return self.action in NEEDS_ACTION

    def describe(self) -> str:
        return f"{self.uuid} ({self.reasons or 'unhealthy'}; action {self.action.label})"


@dataclass(frozen=True, slots=True)
class FleetVerdicts:
    """What every agent published: the GPU nodes, and per node its fenced devices."""

    gpu_nodes: frozenset[str]
    fenced: dict[str, tuple[FencedDevice, ...]]  # node -> its fenced devices, by UUID

    @property
    def reporting(self) -> frozenset[str]:
        """The nodes that report at least one unhealthy device now."""
        return frozenset(n for n, devices in self.fenced.items() if devices)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _has_gpu_capacity(node: Obj) -> bool:
    capacity = (node.get("status") or {}).get("capacity") or {}
    return any(
        k.startswith(GPU_RESOURCE_PREFIXES) and str(v) not in ("0", "") for k, v in capacity.items()
    )


def _labelled_gpu_node(node: Obj) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return str(labels.get(GPU_NODE_LABEL, "")).lower() == "true"


def _has_our_condition(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == CONDITION_TYPE for c in conditions)


def our_rules(rules: Iterable[Obj]) -> dict[str, list[Obj]]:
    """node -> the DeviceTaintRules the agent of that node keeps (others are not ours)."""
    out: dict[str, list[Obj]] = {}
    for rule in rules:
        labels = (rule.get("metadata") or {}).get("labels") or {}
        node = labels.get(NODE_LABEL)
        if labels.get(MANAGED_BY) == MANAGER and node:
            out.setdefault(str(node), []).append(rule)
    return out


def _dra_id(rule: Obj) -> DraId | None:
    selector = (rule.get("spec") or {}).get("deviceSelector") or {}
    parts = (selector.get("driver"), selector.get("pool"), selector.get("device"))
    if not all(isinstance(p, str) and p for p in parts):
        return None
    return (str(parts[0]), str(parts[1]), str(parts[2]))


def read_verdicts(nodes: Iterable[Obj], rules: Iterable[Obj]) -> FleetVerdicts:
    """Every node's fenced devices from its Node and its DeviceTaintRules (a device both
    name keeps the condition's entry, with the rule's DRA device added)."""
    by_rule = our_rules(rules)
    gpu_nodes: set[str] = set(by_rule)
    fenced: dict[str, dict[str, FencedDevice]] = {}
    for node in nodes:
        name = _name(node)
        if not name:
            continue
        if _has_gpu_capacity(node) or _labelled_gpu_node(node) or _has_our_condition(node):
            gpu_nodes.add(name)
        for fence in node_fences(node):
            devices = fenced.setdefault(name, {})
            devices[fence.uuid] = FencedDevice(
                name, fence.uuid, fence.action, fence.reasons, fence.since
            )
    for name, node_rules in by_rule.items():
        devices = fenced.setdefault(name, {})
        for rule in node_rules:
            dra = _dra_id(rule)
            for fence in rule_fences([rule]):
                known = devices.get(fence.uuid)
                if known is not None:
                    devices[fence.uuid] = FencedDevice(
                        name, known.uuid, max(known.action, fence.action), known.reasons,
                        min(known.since, fence.since) if known.since else fence.since, dra,
                    )  # fmt: skip
                else:
                    devices[fence.uuid] = FencedDevice(
                        name, fence.uuid, fence.action, fence.reasons, fence.since, dra
                    )
    return FleetVerdicts(
        frozenset(gpu_nodes),
        {n: tuple(sorted(d.values(), key=lambda x: x.uuid)) for n, d in fenced.items() if d},
    )
