"""The kubelet device manager's checkpoint: ``kubelet_internal_checkpoint`` in the device-plugin
folder, holding every container's devices and the Allocate answer the plugin gave for them.

A real kubelet (../shared/kubelet.md) writes it after each allocation and reads it at start:
a container that starts again (after a kubelet or plugin restart) gets the checkpointed answer,
not a new Allocate call, so a bad answer stays with the pod until the pod is deleted.

The layout is the kubelet's (pkg/kubelet/cm/devicemanager/checkpoint, Go's encoding/json):
compact JSON, fields in the Go structures' order, ``{"Data": {"PodDeviceEntries": [{"PodUID",
"ContainerName", "ResourceName", "DeviceIDs", "AllocResp"}], "RegisteredDevices": {resource:
[ids]}}, "Checksum": N}``. ``DeviceIDs`` maps each NUMA node (a string key, as Go writes an
int64 map key) to the ids on it, as the plugin's ListAndWatch topology said; a device without
topology is under ``"-1"``, one on two nodes under both. ``AllocResp`` is base64 of the
serialized ContainerAllocateResponse. One difference: the checksum here is CRC-32 of the data,
not the kubelet's FNV-32a of its Go structure as go-spew prints it; only a kubelet verifies it,
and gpu-exporter (exporter/enrich/devicecheckpoint.py) does not.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
NO_NUMA = "-1"


class CorruptCheckpointError(ValueError):
    """The file exists but cannot be trusted; the kubelet then starts with no allocations."""


@dataclass(frozen=True, slots=True)
class PodDeviceEntry:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    alloc_resp: bytes  # the serialized ContainerAllocateResponse
    # device ID -> its NUMA nodes (ListAndWatch topology); absent or empty: no topology
    numa: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def per_numa(self) -> dict[str, list[str]]:
        """DeviceIDs as the kubelet writes them: NUMA node (a string) -> ids."""
        nodes = dict(self.numa)
        out: dict[str, list[str]] = {}
        for device_id in self.device_ids:
            for node in nodes.get(device_id) or (int(NO_NUMA),):
                out.setdefault(str(node), []).append(device_id)
        return dict(sorted(out.items()))  # Go sorts map keys as strings: "-1" < "0" < "1"


def _data(entries: list[PodDeviceEntry], registered: Mapping[str, list[str]]) -> dict[str, Any]:
    return {
        "PodDeviceEntries": [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container,
                "ResourceName": e.resource,
                "DeviceIDs": e.per_numa(),
                "AllocResp": base64.b64encode(e.alloc_resp).decode(),
            }
            for e in entries
        ],
        "RegisteredDevices": {r: list(ids) for r, ids in sorted(registered.items())},
    }


def _checksum(data: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(data, sort_keys=True).encode())


def write(path: Path, entries: list[PodDeviceEntry], registered: Mapping[str, list[str]]) -> None:
    """Replace the checkpoint atomically (a kubelet killed mid-write leaves the old one)."""
    data = _data(entries, registered)
    tmp = path.with_name(path.name + ".tmp")
    # Go's json.Marshal: no spaces, map keys sorted as strings, struct fields in order
    text = json.dumps({"Data": data, "Checksum": _checksum(data)}, separators=(",", ":"))
    tmp.write_text(text)
    tmp.replace(path)


def _entry(raw: dict[str, Any]) -> PodDeviceEntry:
    nodes: dict[str, list[int]] = {}
    for node, ids in sorted(raw["DeviceIDs"].items(), key=lambda kv: int(kv[0])):
        for device_id in ids:
            nodes.setdefault(device_id, []).append(int(node))
    return PodDeviceEntry(
        str(raw["PodUID"]),
        str(raw["ContainerName"]),
        str(raw["ResourceName"]),
        tuple(nodes),
        base64.b64decode(raw["AllocResp"], validate=True),
        tuple((i, tuple(n)) for i, n in nodes.items() if n != [int(NO_NUMA)]),
    )


def read(path: Path) -> tuple[list[PodDeviceEntry], dict[str, list[str]]]:
    """(entries, registered devices per resource); ([], {}) when there is no file."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return [], {}
    except (OSError, ValueError) as exc:
        raise CorruptCheckpointError(f"{path}: {exc}") from exc
    try:
        data = raw["Data"]
        if raw["Checksum"] != _checksum(data):
            raise CorruptCheckpointError(f"{path}: checksum mismatch")
        entries = [_entry(e) for e in data["PodDeviceEntries"] or []]
        registered = {str(r): list(ids) for r, ids in data["RegisteredDevices"].items()}
    except (KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise CorruptCheckpointError(f"{path}: malformed ({exc!r})") from exc
    return entries, registered
