"""A pod's UID -> its namespace, name and container names, from V1Pod objects (pure).

Neither a process's cgroup nor the kubelet's pod-resources answer carries both halves: the
cgroup names the pod UID and container id, the API server's pods name them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    pod: str
    containers: Mapping[str, str]  # container id -> container name
    only_container: str  # the name when the pod has exactly one container, else ""


def pod_names(pods: Iterable[Any]) -> dict[str, PodName]:
    """pod UID -> its names, from V1Pod objects (or anything shaped like them)."""
    out: dict[str, PodName] = {}
    for pod in pods:
        meta, spec, status = pod.metadata, pod.spec, pod.status
        containers: dict[str, str] = {}
        statuses = [
            *(getattr(status, "container_statuses", None) or []),
            *(getattr(status, "init_container_statuses", None) or []),
            *(getattr(status, "ephemeral_container_statuses", None) or []),
        ]
        for cs in statuses:
            cid = (cs.container_id or "").rpartition("://")[2]
            if cid:
                containers[cid.lower()] = cs.name
        names = [c.name for c in (getattr(spec, "containers", None) or [])]
        out[str(meta.uid).lower()] = PodName(
            namespace=meta.namespace,
            pod=meta.name,
            containers=containers,
            only_container=names[0] if len(names) == 1 else "",
        )
    return out
