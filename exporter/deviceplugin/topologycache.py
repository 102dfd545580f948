"""The GPU topology for GetPreferredAllocation, read again at most every few minutes.

``read`` is collect/interconnect.py's NVML reading (exporter/app.py passes it in, so the device
plugin never touches NVML); a reading that fails keeps the last topology (or none: the
preference then falls back to index order).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpuquota.exporter.deviceplugin.preferred import Topology
from gpuquota.exporter.deviceplugin.topology import topology_of
from gpuquota.exporter.snapshot import Interconnect


class CachedTopology:
    """A ``() -> Topology`` for the device plugin that reads the interconnect at most every
    ``ttl_s``."""

    def __init__(self, read: Callable[[], Interconnect | None], ttl_s: float = 300.0) -> None:
        self.read = read
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: Topology | None = None
        self._read_at = 0.0

    def __call__(self) -> Topology:
        with self._lock:
            if self._value is None or time.monotonic() - self._read_at > self.ttl_s:
                interconnect = self.read()
                if interconnect is not None:
                    self._value = topology_of(interconnect)
                self._value = self._value or Topology()
                self._read_at = time.monotonic()
            return self._value
