"""A pod's UID -> its namespace, name and container names, from pods as the API server's JSON
(plain dicts, pure).

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


def pod_names(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodName]:
    """pod UID -> its names, from pods as the API server's JSON (dicts)."""
    out: dict[str, PodName] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if not meta.get("uid"):
            continue
        containers: dict[str, str] = {}
        statuses = [
            *(status.get("containerStatuses") or []),
            *(status.get("initContainerStatuses") or []),
            *(status.get("ephemeralContainerStatuses") or []),
        ]
        for cs in statuses:
            cid = str(cs.get("containerID") or "").rpartition("://")[2]
            if cid:
                containers[cid.lower()] = str(cs.get("name", ""))
        names = [str(c.get("name", "")) for c in (spec.get("containers") or [])]
        out[str(meta["uid"]).lower()] = PodName(
            namespace=str(meta.get("namespace", "")),
            pod=str(meta.get("name", "")),
            containers=containers,
            only_container=names[0] if len(names) == 1 else "",
        )
    return out
