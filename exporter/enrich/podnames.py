"""A pod's UID <-> its namespace and name, from what the node itself knows (pure).

A GPU process's cgroup names its pod by UID (exporter/enrich/cgroup.py); the kubelet's
pod-resources List names pods by namespace and name and says which devices each container
holds, but carries no UID. Two sources tie the halves together without asking the API server
for pods (the agent has no right to: docs/operations.md, "What each component can do"):

* the device manager's checkpoint (exporter/enrich/devicecheckpoint.py): pod UID, container,
  resource and device ids for every device-plugin allocation. A listed pod is the checkpoint
  UID whose (container, resource, device id) entries include all of the pod's; device ids are
  exclusive per container, so at most one UID fits. The checkpoint also holds init
  containers' devices, which List leaves out, hence "include", not "equal";
* the ResourceClaims a DRA pod names (their ``status.reservedFor`` lists each consuming pod's
  name and UID, read by exporter/enrich/claimreader.py for the claims this node's containers
  name): a listed pod whose claim reserves a pod of its name in its namespace has that UID.

A fit that is not unique (two UIDs, or one UID for two pods: a checkpoint not yet rewritten
after a pod went away) names nobody: no pod is ever named for another's process. A pod known
by neither (it holds no device through the kubelet, e.g. one that sees GPUs by
NVIDIA_VISIBLE_DEVICES) stays a UID, which the controller, which watches every pod, can join
(docs/metrics.md, ``pod_uid``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuquota.exporter.enrich.devicecheckpoint import CheckpointEntry
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb

PodKey = tuple[str, str]  # (namespace, pod)
ClaimKey = tuple[str, str]  # (namespace, claim)
# a claim -> the pods it is reserved for, as (pod name, pod UID); None: not read (yet)
ReservedFor = Callable[[str, str], "Iterable[tuple[str, str]] | None"]


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    pod: str
    containers: tuple[str, ...]  # as pod-resources lists them (spec order)

    @property
    def only_container(self) -> str:
        """The container's name when the pod has exactly one, else ""."""
        return self.containers[0] if len(self.containers) == 1 else ""


@dataclass(frozen=True, slots=True)
class PodNames:
    """The pods of this node the kubelet lists, by UID where the node can tell it."""

    by_uid: Mapping[str, PodName] = field(default_factory=dict)
    uids: Mapping[PodKey, str] = field(default_factory=dict)
    # claims a listed pod names whose reservation does not (yet) name that pod: read again
    stale_claims: frozenset[ClaimKey] = frozenset()


def _triples(pod: pb.PodResources) -> set[tuple[str, str, str]]:
    return {
        (c.name, d.resource_name, i)
        for c in pod.containers
        for d in c.devices
        for i in d.device_ids
    }


def node_pod_names(
    response: pb.ListPodResourcesResponse,
    entries: Iterable[CheckpointEntry],
    reserved_for: ReservedFor | None = None,
) -> PodNames:
    """Join a pod-resources List answer with the device checkpoint and the DRA claims'
    reservations into UID <-> name, where exactly one UID fits."""
    holders: dict[tuple[str, str, str], set[str]] = {}
    for e in entries:
        for device_id in e.device_ids:
            holders.setdefault((e.container, e.resource, device_id), set()).add(e.pod_uid)
    found: dict[PodKey, set[str]] = {}
    stale: set[ClaimKey] = set()
    listed: dict[PodKey, PodName] = {}
    for pod in response.pod_resources:
        key = (pod.namespace, pod.name)
        listed[key] = PodName(pod.namespace, pod.name, tuple(c.name for c in pod.containers))
        triples = _triples(pod)
        if triples:
            fits = set.intersection(*(holders.get(t, set()) for t in triples))
            found.setdefault(key, set()).update(fits)
        if reserved_for is None:
            continue
        for claim in {
            (r.claim_namespace or pod.namespace, r.claim_name)
            for c in pod.containers
            for r in c.dynamic_resources
        }:
            if claim[0] != pod.namespace:
                continue  # a pod names claims of its own namespace only
            reserved = reserved_for(*claim)
            if reserved is None:
                continue
            uids = {uid.lower() for name, uid in reserved if name == pod.name and uid}
            if not uids:
                stale.add(claim)
            found.setdefault(key, set()).update(uids)
    owners: dict[str, list[PodKey]] = {}
    for key, uids in found.items():
        if len(uids) == 1:
            owners.setdefault(next(iter(uids)), []).append(key)
    by_uid = {uid: listed[keys[0]] for uid, keys in owners.items() if len(keys) == 1}
    return PodNames(
        by_uid=by_uid,
        uids={(n.namespace, n.pod): uid for uid, n in by_uid.items()},
        stale_claims=frozenset(stale),
    )
