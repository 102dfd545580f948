"""Allocate: what a container gets for the device IDs the kubelet chose. Pure.

* ``NVIDIA_VISIBLE_DEVICES`` lists the chosen GPU / MIG UUIDs (replicas of one GPU collapse),
  or, with CDI on, the CDI device names ``nvidia.com/gpu=<uuid>`` go in ``cdi_devices`` and
  ``NVIDIA_VISIBLE_DEVICES=void`` keeps the NVIDIA runtime hook from adding GPUs of its own
  (CUDA base images set ``NVIDIA_VISIBLE_DEVICES=all``).
* Device nodes: ``/dev/nvidia<minor>`` of each physical GPU plus the control and UVM nodes.
  With CDI the CDI spec carries them, so none are listed here.

Unknown IDs and empty requests are refused as invalid; unhealthy devices as a failed
precondition; both with a message naming the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuquota.exporter.deviceplugin.devices import HEALTHY, PluginConfig, PluginDevice

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


class AllocationError(Exception):
    """``kind`` is "invalid" (malformed request) or "precondition" (device not usable now)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    device_nodes: tuple[str, ...] = ()  # host path == container path, permissions "rw"
    cdi_devices: tuple[str, ...] = ()


def allocate_container(
    ids: Sequence[str], devices: Mapping[str, PluginDevice], config: PluginConfig, resource: str
) -> ContainerAllocation:
    if not ids:
        raise AllocationError("invalid", f"allocate request for {resource} names no devices")
    duplicates = sorted({i for i in ids if list(ids).count(i) > 1})
    if duplicates:
        raise AllocationError("invalid", f"device ID(s) requested twice: {', '.join(duplicates)}")
    unknown = [i for i in ids if i not in devices]
    if unknown:
        raise AllocationError("invalid", f"unknown {resource} device ID(s): {', '.join(unknown)}")
    sick = [devices[i] for i in ids if devices[i].health != HEALTHY]
    if sick:
        detail = "; ".join(f"{d.id} ({d.reasons or 'unhealthy'})" for d in sick)
        raise AllocationError(
            "precondition", f"device(s) unhealthy, refusing to allocate: {detail}"
        )

    chosen = [devices[i] for i in ids]
    uuids = list(dict.fromkeys(d.uuid for d in chosen))
    if config.cdi:
        return ContainerAllocation(
            envs={VISIBLE_DEVICES: "void"},
            cdi_devices=tuple(f"{config.cdi_kind}={u}" for u in uuids),
        )
    nodes: list[str] = []
    for device in chosen:
        if device.minor_number is None:
            raise AllocationError(
                "precondition", f"device {device.id}: NVML gave no minor number for /dev/nvidiaN"
            )
        node = f"/dev/nvidia{device.minor_number}"
        if node not in nodes:
            nodes.append(node)
    return ContainerAllocation(
        envs={VISIBLE_DEVICES: ",".join(uuids)}, device_nodes=(*nodes, *CONTROL_NODES)
    )
