"""Which pods hold a fenced GPU, what may be done to them, and when everything stops. Pure.

A pod is in trouble when it runs (``spec.nodeName``) on a node whose agent published a fence
needing a reset or a reboot (quota/remediation/verdicts.py), and holds that very device by
what the cluster itself says about the pod, not by any list of the agent's:

* device plugin: a container's ``status.containerStatuses[].allocatedResourcesStatus`` (KEP-4680,
  on by default in Kubernetes 1.36) lists the device ID with health ``Unhealthy``, which the
  kubelet sets from the device plugin's health stream (../shared/kubelet.md). A time-sliced
  replica ``<UUID>::<n>`` is its GPU. The kubelet's word is a second, independent witness:
  a device it still calls Healthy is not acted on (the fence may be stale);
* DRA: a claim of the pod (``status.resourceClaimStatuses``) reserved for the pod's UID whose
  allocation holds the DRA device the agent's DeviceTaintRule selects.

So a pod recreated under the same name on another node, or on the same node with other
devices, is never in trouble for the old pod's GPU: the decision is the pod object's own
(its UID, its node, its devices), and the act carries that UID as a precondition.

Never touched (neither marked nor evicted): a static pod (``kubernetes.io/config.mirror``),
a pod already terminating or finished, one that opted out with the annotation
``gpuquota.io/evict-on-gpu-failure: "false"``.

The circuit breaker: when more than ``share`` of the GPU nodes (and at least ``min_nodes``)
report a fence at once, the verdict is more likely wrong everywhere (NVML gone during a
driver upgrade, a bad health config rolled out) than right everywhere: nothing is done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpuquota.exporter.health.verdict import Action
from gpuquota.quota.remediation.verdicts import FencedDevice, FleetVerdicts

Obj = dict[str, Any]
CONDITION_TYPE = "GPUUnhealthy"
OPT_OUT_ANNOTATION = "gpuquota.io/evict-on-gpu-failure"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
REASONS = {Action.RESET_GPU: "GPUNeedsReset", Action.REBOOT_NODE: "GPUNeedsReboot"}
UNHEALTHY = "Unhealthy"
REPLICA_SEPARATOR = "::"  # exporter/deviceplugin/devices.py: a time-sliced replica's ID


@dataclass(frozen=True, slots=True)
class PodTrouble:
    """A pod, as one object (its UID), holding fenced devices on the node it runs on."""

    namespace: str
    pod: str
    uid: str
    node: str
    devices: tuple[FencedDevice, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.pod)

    @property
    def since(self) -> float:
        return min(d.since for d in self.devices)

    @property
    def action(self) -> Action:
        return max(d.action for d in self.devices)

    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    def message(self) -> str:
        return "; ".join(d.describe() for d in self.devices)


def _meta(pod: Obj) -> Obj:
    return pod.get("metadata") or {}


def _statuses(pod: Obj) -> list[Obj]:
    status = pod.get("status") or {}
    out: list[Obj] = []
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        out += [s for s in status.get(key) or [] if isinstance(s, dict)]
    return out


def held_devices(
    pod: Obj, fences: Iterable[FencedDevice], claims: Mapping[tuple[str, str], Obj]
) -> tuple[FencedDevice, ...]:
    """The fenced devices (needing a reset or reboot) of the pod's own node that this pod
    object holds; ``claims``: (namespace, name) -> ResourceClaim, for its DRA claims."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    mine = [d for d in fences if d.node == node and d.acted_on] if node else []
    if not mine:
        return ()
    by_uuid = {d.uuid: d for d in mine}
    by_dra = {d.dra: d for d in mine if d.dra is not None}
    found: dict[str, FencedDevice] = {}
    for status in _statuses(pod):
        for group in status.get("allocatedResourcesStatus") or []:
            for resource in (group or {}).get("resources") or []:
                if (resource or {}).get("health") != UNHEALTHY:
                    continue  # the kubelet does not confirm it: not ours to act on
                rid = str(resource.get("resourceID") or "")
                device = by_uuid.get(rid.split(REPLICA_SEPARATOR, 1)[0])
                if device is None and rid.count("/") == 2:
                    driver, pool, name = rid.split("/")
                    device = by_dra.get((driver, pool, name))
                if device is not None:
                    found[device.uuid] = device
    uid = _meta(pod).get("uid")
    namespace = str(_meta(pod).get("namespace") or "")
    for ref in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        claim = claims.get((namespace, str((ref or {}).get("resourceClaimName") or "")))
        if claim is None or not uid:
            continue
        status = claim.get("status") or {}
        if not any((r or {}).get("uid") == uid for r in status.get("reservedFor") or []):
            continue  # the claim is not this pod object's (any more)
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            device = by_dra.get(key)
            if device is not None:
                found[device.uuid] = device
    return tuple(sorted(found.values(), key=lambda d: d.uuid))


def trouble_of(
    pod: Obj, verdicts: FleetVerdicts, claims: Mapping[tuple[str, str], Obj]
) -> PodTrouble | None:
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    devices = held_devices(pod, verdicts.fenced.get(node, ()), claims)
    if not devices:
        return None
    meta = _meta(pod)
    return PodTrouble(
        str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""),
        node, devices,
    )  # fmt: skip


def claims_wanted(pods: Iterable[Obj], verdicts: FleetVerdicts) -> set[tuple[str, str]]:
    """(namespace, claim) of the pods on nodes with a fenced DRA device: the claims to read."""
    dra_nodes = {n for n, ds in verdicts.fenced.items() if any(d.dra for d in ds)}
    out = set()
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") not in dra_nodes:
            continue
        namespace = str(_meta(pod).get("namespace") or "")
        for ref in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            name = (ref or {}).get("resourceClaimName")
            if name:
                out.add((namespace, str(name)))
    return out


def untouchable(pod: Obj) -> str | None:
    """Why this pod is never marked nor evicted, or None."""
    meta = _meta(pod)
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


def still_the_one(
    pod: Obj, trouble: PodTrouble, claims: Mapping[tuple[str, str], Obj]
) -> str | None:
    """Why the pod as read now is not the one the decision was about, or None: another UID
    (recreated under the same name), another node, or none of the fenced devices any more."""
    meta = _meta(pod)
    if meta.get("uid") != trouble.uid:
        return f"recreated (UID {meta.get('uid')}, the decision was about {trouble.uid})"
    node = (pod.get("spec") or {}).get("nodeName")
    if node != trouble.node:
        return f"runs on {node or 'no node'}, not on the fenced node {trouble.node}"
    if not held_devices(pod, trouble.devices, claims):
        return "holds none of the fenced devices any more"
    return None


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
            "message": "the GPUs this pod holds are no longer fenced",
        }
    else:
        wanted = {
            "type": CONDITION_TYPE,
            "status": "True",
            "reason": REASONS.get(trouble.action, "GPUUnhealthy"),
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


def due_for_eviction(
    troubles: Iterable[PodTrouble], now: float, after_s: float
) -> list[PodTrouble]:
    """Pods in trouble for at least ``after_s``, oldest trouble first."""
    due = [t for t in troubles if now - t.since >= after_s]
    return sorted(due, key=lambda t: (t.since, t.key))


@dataclass(frozen=True, slots=True)
class Breaker:
    """Stop everything when more than ``share`` of the GPU nodes, and at least ``min_nodes``
    of them, report a fence at the same time."""

    share: Fraction
    min_nodes: int

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"the breaker's share must be in (0, 1], got {float(self.share)}")
        if self.min_nodes < 1:
            raise ValueError(f"the breaker's node count must be >= 1, got {self.min_nodes}")

    def tripped(self, verdicts: FleetVerdicts) -> str | None:
        """Why every action stops now, or None."""
        reporting = len(verdicts.reporting)
        total = max(len(verdicts.gpu_nodes | verdicts.reporting), 1)
        if reporting >= self.min_nodes and Fraction(reporting, total) > self.share:
            return (
                f"{reporting} of {total} GPU nodes report unhealthy GPUs at once (more than "
                f"{float(self.share):.0%}): the verdict is more likely wrong everywhere than "
                "right everywhere"
            )
        return None
