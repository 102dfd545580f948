"""Builders of Kubernetes objects (plain dicts in API JSON form) for the quota tests."""

from __future__ import annotations

from typing import Any

from gpuquota.quota.accounting import format_time


def ts(seconds: int | None) -> str | None:
    return None if seconds is None else format_time(seconds)


def container(
    name: str = "main",
    gpus: int = 0,
    resource: str = "nvidia.com/gpu",
    *,
    cpu: str | None = None,
    memory: str | None = None,
    limits_only: bool = False,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if gpus:
        limits[resource] = str(gpus)
        if not limits_only:
            requests[resource] = str(gpus)
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    out: dict[str, Any] = {"name": name, "image": "busybox", "resources": {}}
    if requests:
        out["resources"]["requests"] = requests
    if limits:
        out["resources"]["limits"] = limits
    if restart_policy:
        out["restartPolicy"] = restart_policy
    return out


def pod(
    uid: str = "uid-1",
    name: str = "train",
    namespace: str = "team-a",
    *,
    node: str | None = "gpu-1",
    gpus: int = 1,
    resource: str = "nvidia.com/gpu",
    phase: str = "Running",
    created: int = 1000,
    start: int | None = 1010,
    finished: int | None = None,
    deletion: int | None = None,
    grace: int | None = None,
    cpu: str | None = "1",
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    overhead: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    labels: dict[str, str] | None = None,
    resource_version: str = "1",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": ts(created),
        "resourceVersion": resource_version,
    }
    if labels:
        meta["labels"] = labels
    if deletion is not None:
        meta["deletionTimestamp"] = ts(deletion)
        meta["deletionGracePeriodSeconds"] = 30 if grace is None else grace
    if owner:
        meta["ownerReferences"] = [
            {"kind": owner[0], "name": owner[1], "controller": True, "uid": "o"}
        ]
    spec: dict[str, Any] = {
        "containers": containers
        if containers is not None
        else [container(gpus=gpus, resource=resource, cpu=cpu)]
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if overhead:
        spec["overhead"] = overhead
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if start is not None:
        status["startTime"] = ts(start)
    if finished is not None:
        status["containerStatuses"] = [
            {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": ts(finished)}}}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def node(
    name: str = "gpu-1",
    *,
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    count: int | None = 8,
    allocatable: dict[str, int] | None = None,
    replicas: int | None = None,
    sharing: str | None = None,
    mig_strategy: str | None = None,
    created: int = 0,
    pool: str | None = "h100",
) -> dict[str, Any]:
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    if product is not None:
        labels["nvidia.com/gpu.product"] = product
    if count is not None:
        labels["nvidia.com/gpu.count"] = str(count)
    if replicas is not None:
        labels["nvidia.com/gpu.replicas"] = str(replicas)
    if sharing is not None:
        labels["nvidia.com/gpu.sharing-strategy"] = sharing
    if mig_strategy is not None:
        labels["nvidia.com/mig.strategy"] = mig_strategy
    if pool is not None:
        labels["karpenter.sh/nodepool"] = pool
    alloc = {"nvidia.com/gpu": count or 0} if allocatable is None else allocatable
    resources = {"cpu": "64", "memory": "512Gi", **{k: str(v) for k, v in alloc.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-{name}",
            "labels": labels,
            "creationTimestamp": ts(created),
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def namespace(
    name: str = "team-a", labels: dict[str, str] | None = None, created: int = 0
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": f"ns-{name}",
            "labels": labels or {},
            "creationTimestamp": ts(created),
        },
    }


def quota(
    namespace: str = "team-a",
    name: str = "gpu",
    *,
    hard: int | None = 4,
    used: int | None = 0,
    scopes: list[str] | None = None,
    created: int = 0,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if hard is not None:
        status["hard"] = {"requests.nvidia.com/gpu": str(hard), "pods": "100"}
    if used is not None:
        status["used"] = {"requests.nvidia.com/gpu": str(used), "pods": "3"}
    spec: dict[str, Any] = {"hard": dict(status.get("hard", {}))}
    if scopes:
        spec["scopes"] = scopes
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"q-{namespace}-{name}",
            "creationTimestamp": ts(created),
        },
        "spec": spec,
        "status": status,
    }


# --- Dynamic Resource Allocation (resource.k8s.io/v1) ---------------------------------------

DRA_DRIVER = "gpu.nvidia.com"


def dra_slice(node: str = "gpu-1", devices: int = 2, created: int = 0) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's DRA driver publishes for ``node``: whole GPUs gpu-0.."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-gpu.nvidia.com",
            "uid": f"slice-{node}",
            "creationTimestamp": ts(created),
        },
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def dra_claim(
    name: str = "gpus",
    namespace: str = "team-a",
    *,
    node: str = "gpu-1",
    devices: tuple[str, ...] = ("gpu-0",),
    device_class: str = "gpu.nvidia.com",
    reserved_for: tuple[str, ...] = (),
    created: int = 0,
) -> dict[str, Any]:
    """A ResourceClaim allocated ``devices`` of ``node``, reserved for pod UIDs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"claim-{namespace}-{name}",
            "creationTimestamp": ts(created),
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": device_class, "count": len(devices)},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRA_DRIVER, "pool": node, "device": d}
                        for d in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": u, "uid": u} for u in reserved_for],
        },
    }


def dra_pod(
    uid: str = "uid-dra",
    name: str = "dra-train",
    namespace: str = "team-a",
    *,
    claim: str = "gpus",
    node: str = "gpu-1",
    created: int = 0,
    start: int | None = None,
) -> dict[str, Any]:
    """A running pod that gets its GPUs through the ResourceClaim ``claim`` only."""
    obj = pod(uid, name, namespace, node=node, gpus=0, created=created, start=start)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    for c in obj["spec"]["containers"]:
        c.setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    return obj
