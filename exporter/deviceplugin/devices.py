"""Which devices each resource advertises to the kubelet, and how healthy each one is.

Pure: derived from the health checker's ``NodeHealth`` alone (it carries each device's
UUID, index, minor number and MIG placement), so the device plugin's view can never disagree
with the metrics or the health endpoint.

* Full GPUs are advertised under the configured resource name (default ``nvidia.com/gpu``),
  ``replicas`` times each when time-slicing is on, with IDs ``<UUID>::<n>``.
* MIG instances are advertised under ``<domain>/mig-<profile>`` (the "mixed" strategy); a GPU
  with MIG instances is not advertised as a full GPU.
* Only UNHEALTHY maps to the kubelet's "Unhealthy": a DEGRADED device still takes pods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuquota.exporter.health.verdict import DeviceHealth, NodeHealth, State

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
REPLICA_SEPARATOR = "::"
DEFAULT_RESOURCE = "nvidia.com/gpu"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


@dataclass(frozen=True, slots=True)
class PluginConfig:
    resource_name: str = DEFAULT_RESOURCE
    replicas: int = 1  # time-slicing: how many pods may share one GPU
    cdi: bool = False  # Allocate answers with CDI device names instead of NVIDIA_VISIBLE_DEVICES
    cdi_kind: str = "nvidia.com/gpu"

    def __post_init__(self) -> None:
        check_resource_name(self.resource_name)
        if self.replicas < 1:
            raise ValueError(f"time-slicing replicas must be >= 1, got {self.replicas}")

    @property
    def domain(self) -> str:
        return self.resource_name.split("/", 1)[0]

    def mig_resource(self, profile: str) -> str:
        return f"{self.domain}/mig-{profile}"


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as an extended resource, or None.

    The kubelet's rule (IsExtendedResourceName): ``<domain>/<name>`` outside kubernetes.io,
    not starting with ``requests.``, and ``requests.<name>`` a qualified name: the domain a
    lowercase DNS subdomain, the name at most 63 of ``[A-Za-z0-9-_.]``, alphanumeric at both
    ends (so a MIG profile such as ``1g.10gb+me`` cannot be a resource name as it is).
    """
    domain, sep, rest = name.partition("/")
    if not sep or not domain or not rest or "/" in rest:
        return "expected <domain>/<name>, e.g. nvidia.com/gpu"
    if "." not in domain or domain.endswith("kubernetes.io") or domain.startswith("requests."):
        return f"domain {domain!r} is not one for extended resources"
    prefix = f"requests.{domain}"
    if len(prefix) > 253 or not all(_DNS_LABEL.match(label) for label in prefix.split(".")):
        return f"domain {domain!r} is not a lowercase DNS subdomain"
    if len(rest) > 63 or not _NAME.match(rest):
        return (
            f"name {rest!r} must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def check_resource_name(name: str) -> None:
    """Extended resource names as the kubelet accepts them (it refuses anything else)."""
    problem = resource_name_problem(name)
    if problem:
        raise ValueError(f"invalid resource name {name!r}: {problem}")


@dataclass(frozen=True, slots=True)
class PluginDevice:
    id: str  # what the kubelet sees: a UUID, or <UUID>::<n> for a time-sliced replica
    uuid: str  # the GPU or MIG instance the ID stands for
    gpu_uuid: str  # the physical GPU (== uuid for full GPUs)
    index: int  # NVML index of the physical GPU
    minor_number: int | None  # /dev/nvidia<minor> of the physical GPU
    health: str  # HEALTHY or UNHEALTHY
    reasons: str = ""  # why not healthy, for error messages


def kubelet_health(device: DeviceHealth) -> str:
    return UNHEALTHY if device.state is State.UNHEALTHY else HEALTHY


def _why(device: DeviceHealth) -> str:
    return ", ".join(r.code for r in device.reasons if r.state is State.UNHEALTHY)


def plugin_devices(health: NodeHealth, config: PluginConfig) -> dict[str, tuple[PluginDevice, ...]]:
    """resource name -> devices, in NVML order. The full-GPU resource is always present."""
    by_uuid = health.by_uuid()
    has_mig = {d.parent_uuid for d in health.devices if d.parent_uuid is not None}
    out: dict[str, list[PluginDevice]] = {config.resource_name: []}
    for device in health.devices:
        if device.parent_uuid is None:
            if device.uuid in has_mig:
                continue
            ids = (
                [device.uuid]
                if config.replicas == 1
                else [f"{device.uuid}{REPLICA_SEPARATOR}{n}" for n in range(config.replicas)]
            )
            for device_id in ids:
                out[config.resource_name].append(
                    PluginDevice(
                        device_id,
                        device.uuid,
                        device.uuid,
                        device.index,
                        device.minor_number,
                        kubelet_health(device),
                        _why(device),
                    )
                )
        else:
            parent = by_uuid.get(device.parent_uuid)
            resource = config.mig_resource(device.mig_profile or "unknown")
            out.setdefault(resource, []).append(
                PluginDevice(
                    device.uuid,
                    device.uuid,
                    device.parent_uuid,
                    parent.index if parent is not None else device.index,
                    parent.minor_number if parent is not None else None,
                    kubelet_health(device),
                    _why(device),
                )
            )
    return {name: tuple(devices) for name, devices in out.items()}


def index_devices(devices: tuple[PluginDevice, ...]) -> Mapping[str, PluginDevice]:
    return {d.id: d for d in devices}
