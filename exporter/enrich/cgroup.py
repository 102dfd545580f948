"""Which pod a process belongs to, from its /proc/<pid>/cgroup text (pure).

The kubelet puts every container in a cgroup under ``kubepods`` whose path carries
``pod<UID>`` (cgroupfs driver) or ``kubepods-<qos>-pod<UID_with_underscores>.slice`` (systemd
driver), then the container id (``<id>``, ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
``docker-<id>.scope``), in cgroup v1 (one line per hierarchy) and v2 (``0::/...``) alike. A
process whose cgroup has no pod is a host process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
# "pod<uid>" as a path segment or inside a systemd slice name, then the container's segment.
_POD = re.compile(rf"(?:^|[/-])pod({_UID})(?:\.slice)?(?:/([^/\n]*))?")
_CONTAINER_ID = re.compile(r"(?:^|[-:])([0-9a-fA-F]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class CgroupPod:
    """What a process's cgroup says about its pod."""

    pod_uid: str  # with dashes, lower case
    container_id: str | None  # 64 hex digits, when the path names the container


def parse_cgroup(text: str) -> CgroupPod | None:
    """The pod (and container) a /proc/<pid>/cgroup names; None for a process of no pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _POD.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        container = None
        segment = match.group(2) or ""
        found = _CONTAINER_ID.search(segment)
        if found is not None:
            container = found.group(1).lower()
        return CgroupPod(pod_uid=uid, container_id=container)
    return None
