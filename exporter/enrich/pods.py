"""Pod attribution as a pure join: the kubelet's pod-resources List answer -> device UUID -> the
pod containers holding it, joined onto a snapshot.

How NVIDIA's device plugin names devices, and how they map back:

* ``nvidia.com/gpu`` (or a renamed ``nvidia.com/gpu.shared``): GPU UUIDs; with time-slicing
  a replica id ``GPU-...::N``, so several pods share one GPU and every one of them is listed.
* ``nvidia.com/mig-<profile>``: MIG device UUIDs (``MIG-...``).
* With ``deviceIDStrategy: index`` the ids are NVML indices; the join resolves a plain
  number through the snapshot's own index -> UUID table (MIG devices named by index pairs
  are not resolved: use the plugin's default uuid strategy with MIG).

The I/O (the kubelet's socket, a refresh thread) is exporter/enrich/podresources.py; DRA
allocations resolve through exporter/enrich/dra.py and join here like device-plugin ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from gpuquota.exporter.enrich.dra import PARTITION_PREFIX, ordered_claims, resolve_partition
from gpuquota.exporter.kubeletapi import podresources_v1_pb2 as pb
from gpuquota.exporter.snapshot import ClaimRef, NodeSnapshot, PodRef

GPU_RESOURCE_PREFIX = "nvidia.com/gpu"  # nvidia.com/gpu and renamed nvidia.com/gpu.shared
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"  # time-slicing replica ids: "<GPU UUID>::<replica>"

DeviceMap = dict[str, tuple[PodRef, ...]]


def is_gpu_resource(resource_name: str) -> bool:
    """True for the resource names NVIDIA's device plugin advertises GPUs and MIG devices as."""
    return resource_name.startswith((GPU_RESOURCE_PREFIX, MIG_RESOURCE_PREFIX))


def physical_device_id(device_id: str) -> str:
    """Strip a time-slicing replica suffix: ``GPU-abc::3`` -> ``GPU-abc``."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def device_pods(response: pb.ListPodResourcesResponse) -> DeviceMap:
    """Map each GPU/MIG device id in a List response to the containers holding it.

    Replica ids collapse onto their GPU; a container holding two replicas of one GPU is
    listed once. Each tuple is sorted, so equal assignments give equal mappings.
    """
    holders: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    holders.setdefault(physical_device_id(device_id), set()).add(ref)
    return {device: ordered_pods(refs) for device, refs in holders.items()}


def ordered_pods(refs: Iterable[PodRef]) -> tuple[PodRef, ...]:
    return tuple(sorted(set(refs), key=lambda r: (r.namespace, r.pod, r.container)))


def attach_pods(snapshot: NodeSnapshot, mapping: Mapping[str, tuple[PodRef, ...]]) -> NodeSnapshot:
    """Return ``snapshot`` with ``pods`` keyed by the UUIDs of the devices it contains.

    Ids that are UUIDs are used as they are; plain numbers (the device plugin's index
    strategy) are resolved through the snapshot's physical GPUs. Devices no pod holds are
    left out.
    """
    if not mapping:
        return snapshot if not snapshot.pods else dataclasses.replace(snapshot, pods={})
    by_index = {d.index: d.uuid for d in snapshot.devices if d.mig is None}
    pods: dict[str, tuple[PodRef, ...]] = {}
    known = {d.uuid for d in snapshot.devices}
    for device_id, refs in mapping.items():
        uuid = device_id
        if device_id.isdigit():
            uuid = by_index.get(int(device_id), device_id)
        elif device_id.startswith(PARTITION_PREFIX):  # a DRA MIG device made on allocation
            uuid = resolve_partition(device_id, snapshot) or device_id
        if uuid in known:
            pods[uuid] = ordered_pods({*pods.get(uuid, ()), *refs})
    return dataclasses.replace(snapshot, pods=pods)


def attach_claims(
    snapshot: NodeSnapshot, claims: Mapping[str, tuple[ClaimRef, ...]]
) -> dict[str, tuple[ClaimRef, ...]]:
    """The DRA claims behind each device of ``snapshot``, by UUID: keys that name a MIG device
    made on allocation are resolved through the snapshot; devices it lacks are left out."""
    known = {d.uuid for d in snapshot.devices}
    resolved: dict[str, tuple[ClaimRef, ...]] = {}
    for key, refs in claims.items():
        uuid = resolve_partition(key, snapshot) or key
        if uuid in known:
            resolved[uuid] = ordered_claims({*resolved.get(uuid, ()), *refs})
    return resolved
