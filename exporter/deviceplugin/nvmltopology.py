"""Reads the GPU interconnect from NVML for GetPreferredAllocation (cached; it rarely changes).

NVML is asked through the exporter's NvmlApi only: which links are active and what is at
their far end, and each pair's PCIe common ancestor. A GPU or a call that does not support
this contributes nothing, so the preference falls back to PCIe distance and then index order.
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import combinations

from gpuquota.exporter.collect.nvml import NVLINK_MAX_LINKS, NvmlApi, NvmlError
from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.deviceplugin.topology import LINK_GPU, LINK_SWITCH, GpuLinks, build_topology

log = logging.getLogger(__name__)


def read_topology(api: NvmlApi) -> Topology:
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
    return build_topology(gpus, levels, numa_nodes)


class CachedTopology:
    """A ``() -> Topology`` for the device plugin that reads NVML at most every ``ttl_s``."""

    def __init__(self, api: NvmlApi, ttl_s: float = 300.0) -> None:
        self.api = api
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: Topology | None = None
        self._read_at = 0.0

    def __call__(self) -> Topology:
        with self._lock:
            if self._value is None or time.monotonic() - self._read_at > self.ttl_s:
                try:
                    self._value = read_topology(self.api)
                except NvmlError as exc:
                    log.warning("cannot read the GPU topology: %s", exc)
                    self._value = self._value or Topology()
                self._read_at = time.monotonic()
            return self._value
