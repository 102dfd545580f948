"""Turns what NVML says about each GPU's NVLinks into the pairwise ``Topology``. Pure.

NVML describes links one GPU at a time: link n is active and its far end is the PCI device
with bus ID x, of type GPU or NVSwitch. Two GPUs wired directly count the links between
them; GPUs on NVSwitches reach each other through the switch fabric, so each pair counts the
smaller of the two GPUs' switch-facing link counts (on an HGX H100 every pair gets 18).
The PCIe side is NVML's topology level of each pair (nvmlDeviceGetTopologyCommonAncestor);
the NUMA node of each GPU goes to the kubelet's topology manager in ListAndWatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.snapshot import LINK_SWITCH, GpuLinks, Interconnect


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:07:00.0' and '0000:07:00.0' are the same device; compare them as one."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return bus_id.strip().lower()
    domain, bus, devfn = parts
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{devfn}"
    except ValueError:
        return bus_id.strip().lower()


def build_topology(
    gpus: Sequence[GpuLinks],
    pcie_levels: Mapping[tuple[str, str], int],
    numa_nodes: Mapping[str, int] | None = None,
) -> Topology:
    by_bus = {normalize_bus_id(g.pci_bus_id): g.uuid for g in gpus}
    direct: dict[tuple[str, str], int] = {}
    to_switch: dict[str, int] = {}
    for gpu in gpus:
        for remote, kind in gpu.links:
            if kind == LINK_SWITCH:
                to_switch[gpu.uuid] = to_switch.get(gpu.uuid, 0) + 1
                continue
            peer = by_bus.get(normalize_bus_id(remote))
            if peer is None or peer == gpu.uuid:
                continue
            key = (gpu.uuid, peer) if gpu.uuid <= peer else (peer, gpu.uuid)
            direct[key] = direct.get(key, 0) + 1
    # Each direct link was seen from both ends.
    nvlinks = {key: (count + 1) // 2 for key, count in direct.items()}
    switched = sorted(to_switch)
    for i, a in enumerate(switched):
        for b in switched[i + 1 :]:
            nvlinks[(a, b)] = nvlinks.get((a, b), 0) + min(to_switch[a], to_switch[b])
    levels = {(a, b) if a <= b else (b, a): level for (a, b), level in pcie_levels.items()}
    return Topology(nvlinks=nvlinks, pcie_level=levels, numa_node=dict(numa_nodes or {}))


def topology_of(interconnect: Interconnect) -> Topology:
    return build_topology(interconnect.gpus, interconnect.pcie_levels, interconnect.numa_nodes)
