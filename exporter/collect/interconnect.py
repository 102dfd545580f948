"""Reads the GPU interconnect from NVML: active NVLinks and their far ends, PCIe distances.

Which links are active and what is at their far end (a GPU or an NVSwitch), each pair's PCIe
common ancestor and each GPU's NUMA node, as an ``Interconnect`` value (exporter/snapshot.py).
A GPU or a call that does not support this contributes nothing, so the device plugin's
preference (exporter/deviceplugin/topology.py) falls back to PCIe distance and then index order.
"""

from __future__ import annotations

import logging
from itertools import combinations

from gpuquota.exporter.collect.nvml import NVLINK_MAX_LINKS, NvmlApi, NvmlError
from gpuquota.exporter.snapshot import LINK_GPU, LINK_SWITCH, GpuLinks, Interconnect

log = logging.getLogger(__name__)


def read_interconnect(api: NvmlApi) -> Interconnect | None:
    """None when NVML cannot even list the GPUs now (said in the log)."""
    try:
        return _read(api)
    except NvmlError as exc:
        log.warning("cannot read the GPU topology: %s", exc)
        return None


def _read(api: NvmlApi) -> Interconnect:
    gpus: list[GpuLinks] = []
    handles = []
    numa_nodes: dict[str, int] = {}
    for index in range(api.device_count()):
        try:
            handle = api.handle(index)
            uuid = api.uuid(handle)
            bus = api.pci_bus_id(handle)
        except NvmlError as exc:
            log.info("topology: skipping GPU %d: %s", index, exc)
            continue
        if uuid is None or bus is None:
            continue
        links: list[tuple[str, str]] = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                if not api.nvlink_active(handle, link):
                    continue
                remote = api.nvlink_remote_bus_id(handle, link)
                switch = api.nvlink_remote_is_switch(handle, link)
            except NvmlError:
                continue
            if remote is not None:
                links.append((remote, LINK_SWITCH if switch else LINK_GPU))
        gpus.append(GpuLinks(uuid, bus, tuple(links)))
        handles.append((uuid, handle))
        try:
            numa = api.numa_node(handle)
        except NvmlError:
            numa = None
        if numa is not None:
            numa_nodes[uuid] = numa
    levels: dict[tuple[str, str], int] = {}
    for (a, ha), (b, hb) in combinations(handles, 2):
        try:
            level = api.topology_level(ha, hb)
        except NvmlError:
            level = None
        if level is not None:
            levels[(a, b)] = level
    return Interconnect(tuple(gpus), levels, numa_nodes)
