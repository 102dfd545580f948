"""The kubelet device manager's checkpoint: ``kubelet_internal_checkpoint`` in the device-plugin
folder, holding every container's devices and the Allocate answer the plugin gave for them.

A real kubelet (../shared/kubelet.md) writes it after each allocation and reads it at start:
a container that starts again (after a kubelet or plugin restart) gets the checkpointed answer,
not a new Allocate call, so a bad answer stays with the pod until the pod is deleted.

The layout follows the kubelet's JSON (``Data.PodDeviceEntries`` with ``PodUID``,
``ContainerName``, ``ResourceName``, ``DeviceIDs`` by NUMA node, ``AllocResp`` as base64 of the
protobuf; ``Data.RegisteredDevices``; ``Checksum``). The checksum here is CRC-32 of the data,
not the kubelet's FNV hash of its Go structure: nothing outside the stand-in reads it.
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


def _data(entries: list[PodDeviceEntry], registered: Mapping[str, list[str]]) -> dict[str, Any]:
    return {
        "PodDeviceEntries": [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container,
                "ResourceName": e.resource,
                "DeviceIDs": {NO_NUMA: list(e.device_ids)},
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
    tmp.write_text(json.dumps({"Data": data, "Checksum": _checksum(data)}))
    tmp.replace(path)


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
        entries = [
            PodDeviceEntry(
                str(e["PodUID"]),
                str(e["ContainerName"]),
                str(e["ResourceName"]),
                tuple(i for ids in e["DeviceIDs"].values() for i in ids),
                base64.b64decode(e["AllocResp"], validate=True),
            )
            for e in data["PodDeviceEntries"]
        ]
        registered = {str(r): list(ids) for r, ids in data["RegisteredDevices"].items()}
    except (KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise CorruptCheckpointError(f"{path}: malformed ({exc!r})") from exc
    return entries, registered
