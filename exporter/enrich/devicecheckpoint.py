"""The kubelet device manager's checkpoint, read: which pod UID's container holds which devices.

``kubelet_internal_checkpoint`` lies in the device-plugin folder
(``/var/lib/kubelet/device-plugins``, whatever the kubelet's ``--root-dir``: ../shared/kubelet.md)
and is the only place on the node that ties a pod's UID to its device-plugin devices: the
pod-resources API names pods by namespace and name only. The kubelet writes it as JSON
(``{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName", "DeviceIDs",
"AllocResp"}], "RegisteredDevices": {...}}, "Checksum": N}``), rewritten whole on each
allocation. ``DeviceIDs`` is a map NUMA node -> ids since Kubernetes 1.20 (node ``-1`` for a
device without topology; a device on two nodes is under both) and a plain list before; both
are read.

The checksum is not verified: it is a hash of the kubelet's Go structure as go-spew prints it,
which only the kubelet can recompute, and the file is replaced atomically (a reader never sees
half of it). ``AllocResp`` (the plugin's Allocate answer: environment, mounts) is never decoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
DEFAULT_CHECKPOINT = Path("/var/lib/kubelet/device-plugins") / CHECKPOINT_FILE


class CheckpointError(ValueError):
    """The file is there but is not a device manager checkpoint (the message names why)."""


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One container's devices of one resource."""

    pod_uid: str  # lower case, with dashes
    container: str
    resource: str
    device_ids: frozenset[str]


def parse_checkpoint(text: str) -> tuple[CheckpointEntry, ...]:
    """The entries of a checkpoint's JSON text (pure); CheckpointError when it is not one."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"not JSON ({exc})") from exc
    data = raw.get("Data") if isinstance(raw, dict) else None
    entries = data.get("PodDeviceEntries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        if isinstance(data, dict) and entries is None:
            return ()  # Go writes a nil slice as null: nothing allocated
        raise CheckpointError("no Data.PodDeviceEntries list")
    return tuple(_entry(e, i) for i, e in enumerate(entries))


def _entry(raw: Any, index: int) -> CheckpointEntry:
    if not isinstance(raw, dict):
        raise CheckpointError(f"PodDeviceEntries[{index}] is not an object")
    fields = [raw.get(k) for k in ("PodUID", "ContainerName", "ResourceName")]
    if not all(isinstance(f, str) and f for f in fields):
        raise CheckpointError(
            f"PodDeviceEntries[{index}] lacks PodUID, ContainerName or ResourceName"
        )
    ids = raw.get("DeviceIDs")
    groups: list[Any] = list(ids.values()) if isinstance(ids, dict) else [ids or []]
    found: set[str] = set()
    for group in groups:
        if not isinstance(group, list) or not all(isinstance(i, str) for i in group):
            raise CheckpointError(f"PodDeviceEntries[{index}].DeviceIDs is not lists of strings")
        found.update(group)
    uid, container, resource = (str(f) for f in fields)
    return CheckpointEntry(uid.lower(), container, resource, frozenset(found))


def read_checkpoint(path: Path) -> tuple[CheckpointEntry, ...]:
    """The checkpoint's entries; () when there is no file (no device plugin has allocated on
    this node yet). OSError and CheckpointError name the path."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ()
    try:
        return parse_checkpoint(text)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
