"""Which pods hold a GPU that needs a reset or a reboot, and what may be done about them. Pure.

The kubelet evicts nothing when a device turns Unhealthy (../shared/kubelet.md): the pod keeps
running on a GPU that will not come back without a reset or a reboot. From the health verdict
and the pod-resources mapping (who holds which GPU or MIG instance) these rules say:

* which pods are in trouble: they hold a device whose verdict is UNHEALTHY with the action
  ``reset_gpu`` or ``reboot_node``; a degraded device, or an unhealthy one whose error a
  restart of the application clears, is no reason to act on a pod;
* the pod condition ``GPUUnhealthy`` each such pod should carry (and "False" once the devices
  recovered), for a remediation controller or a human to act on;
* which pods are due for eviction: in trouble for at least ``after_s`` (a verdict that
  vanishes within seconds evicts nothing), oldest trouble first, at most ``max_evictions`` per
  ``window_s`` (:class:`EvictionBudget`), never a static pod, a pod already terminating or
  finished, or one that opted out with the annotation ``gpuquota.io/evict-on-gpu-failure:
  "false"``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuquota.exporter.health.verdict import Action, NodeHealth, State
from gpuquota.exporter.snapshot import PodRef

CONDITION_TYPE = "GPUUnhealthy"
NEEDS_ACTION = (Action.RESET_GPU, Action.REBOOT_NODE)
OPT_OUT_ANNOTATION = "gpuquota.io/evict-on-gpu-failure"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
REASONS = {Action.RESET_GPU: "GPUNeedsReset", Action.REBOOT_NODE: "GPUNeedsReboot"}

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class FailedDevice:
    uuid: str
    action: Action
    reasons: tuple[str, ...]  # reason codes: xid_79, row_remap_failure, ...
    since: float  # unix time the device became unhealthy


@dataclass(frozen=True, slots=True)
class PodTrouble:
    """A pod holding one or more devices that need a reset or a reboot."""

    namespace: str
    pod: str
    devices: tuple[FailedDevice, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.pod)

    @property
    def since(self) -> float:
        return min(d.since for d in self.devices)

    @property
    def action(self) -> Action:
        return max(d.action for d in self.devices)

    def message(self) -> str:
        return "; ".join(
            f"{d.uuid} ({', '.join(d.reasons) or 'unhealthy'}; action {d.action.label})"
            for d in self.devices
        )


def failed_devices(health: NodeHealth) -> dict[str, FailedDevice]:
    """uuid -> device, for every GPU or MIG instance whose verdict needs a reset or reboot."""
    return {
        d.uuid: FailedDevice(
            d.uuid,
            d.action,
            tuple(r.code for r in d.reasons if r.state is State.UNHEALTHY),
            d.since,
        )
        for d in health.devices
        if d.state is State.UNHEALTHY and d.action in NEEDS_ACTION
    }


def pods_in_trouble(
    health: NodeHealth, holders: Mapping[str, Sequence[PodRef]]
) -> dict[tuple[str, str], PodTrouble]:
    """(namespace, pod) -> its trouble. ``holders`` is pod attribution's mapping: GPU or MIG
    instance UUID (time-sliced replicas already folded into their GPU) -> the pods on it."""
    failed = failed_devices(health)
    found: dict[tuple[str, str], list[FailedDevice]] = {}
    for uuid, pods in holders.items():
        device = failed.get(uuid)
        if device is None:
            continue
        for ref in pods:
            held = found.setdefault((ref.namespace, ref.pod), [])
            if device not in held:
                held.append(device)
    return {
        key: PodTrouble(key[0], key[1], tuple(sorted(devices, key=lambda d: d.uuid)))
        for key, devices in found.items()
    }


def pod_condition(trouble: PodTrouble | None, current: Obj | None, now: str) -> Obj | None:
    """The condition to write on a pod (``now`` an RFC 3339 time), or None when the pod already
    says so (or never carried ours and has no trouble): no write then."""
    if trouble is None:
        if current is None or current.get("status") == "False":
            return None
        wanted: Obj = {
            "type": CONDITION_TYPE,
            "status": "False",
            "reason": "GPUHealthy",
            "message": "the GPUs this pod holds are healthy again",
        }
    else:
        wanted = {
            "type": CONDITION_TYPE,
            "status": "True",
            "reason": REASONS[trouble.action],
            "message": trouble.message(),
        }
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return None
    same_status = current is not None and current.get("status") == wanted["status"]
    wanted["lastTransitionTime"] = (
        current.get("lastTransitionTime", now) if current is not None and same_status else now
    )
    wanted["lastProbeTime"] = None
    return wanted


def our_condition(pod: Obj) -> Obj | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)


def eviction_refusal(pod: Obj) -> str | None:
    """Why this pod must not be evicted, or None."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if MIRROR_ANNOTATION in annotations:
        return "a static pod (the kubelet runs it from a file; eviction cannot remove it)"
    if meta.get("deletionTimestamp"):
        return "already terminating"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "already finished"
    if str(annotations.get(OPT_OUT_ANNOTATION, "")).lower() == "false":
        return f"opted out ({OPT_OUT_ANNOTATION}: false)"
    return None


def due_for_eviction(
    troubles: Iterable[PodTrouble], now: float, after_s: float, done: set[tuple[str, str]]
) -> list[PodTrouble]:
    """Pods in trouble for at least ``after_s`` and not handled yet, oldest trouble first."""
    due = [t for t in troubles if now - t.since >= after_s and t.key not in done]
    return sorted(due, key=lambda t: (t.since, t.key))


class EvictionBudget:
    """At most ``max_evictions`` in any ``window_s`` seconds (a sliding window)."""

    def __init__(self, max_evictions: int, window_s: float) -> None:
        if max_evictions < 1:
            raise ValueError(f"the eviction limit must be >= 1, got {max_evictions}")
        if window_s <= 0:
            raise ValueError(f"the eviction window must be positive, got {window_s}")
        self.max_evictions = max_evictions
        self.window_s = window_s
        self._spent: deque[float] = deque()

    def left(self, now: float) -> int:
        while self._spent and now - self._spent[0] >= self.window_s:
            self._spent.popleft()
        return self.max_evictions - len(self._spent)

    def spend(self, now: float) -> None:
        self._spent.append(now)
