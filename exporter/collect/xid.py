"""XID events: a thread blocked in nvmlEventSetWait_v2 on every GPU's XID events.

The driver reports XIDs (its error codes, NVIDIA's XID catalog) as NVML events. The watcher
registers one event set for nvmlEventTypeXidCriticalError on every GPU, waits on it with a
short timeout (so ``stop()`` returns within about half a second), counts events per GPU UUID
and XID code for the metrics (``counts()``), and calls listeners (the health checker) with
each ``XidEvent``. A GPU that cannot register (NOT_SUPPORTED, e.g. some consumer boards) is
left out with one log line; the others are still watched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuquota.exporter.collect.nvml import XID_EVENT, EventSet, NvmlApi, NvmlError, handle_key

log = logging.getLogger(__name__)

WAIT_MS = 500


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str  # the physical GPU's UUID
    gpu_index: int
    xid: int
    at: float  # unix time the event was received
    gpu_instance_id: int | None = None  # MIG: the GPU instance the XID is scoped to
    compute_instance_id: int | None = None


Listener = Callable[[XidEvent], None]


class XidWatcher:
    """Counts XID events per GPU; see the module docstring."""

    def __init__(self, api: NvmlApi, *, wait_ms: int = WAIT_MS) -> None:
        self.api = api
        self.wait_ms = wait_ms
        self._listeners: list[Listener] = []
        self._counts: dict[str, dict[int, int]] = {}
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: EventSet | None = None
        self._devices: dict[int, tuple[int, str]] = {}  # handle key -> (index, uuid)
        self.watched: list[str] = []  # UUIDs registered for XID events

    def add_listener(self, callback: Listener) -> None:
        self._listeners.append(callback)

    def counts(self) -> dict[str, dict[int, int]]:
        """UUID -> XID code -> events since start (a copy)."""
        with self._lock:
            return {uuid: dict(codes) for uuid, codes in self._counts.items()}

    def last(self) -> dict[str, int]:
        """UUID -> the most recent XID code."""
        with self._lock:
            return dict(self._last)

    def start(self) -> None:
        """Register every GPU and start the waiting thread."""
        api = self.api
        self._event_set = api.event_set_create()
        if self._event_set is None:
            log.warning("this NVML has no event API; XID events are not watched")
            return
        for index in range(api.device_count()):
            try:
                handle = api.handle(index)
                uuid = api.uuid(handle) or ""
                if not api.register_events(handle, XID_EVENT, self._event_set):
                    log.warning("GPU %d does not report XID events; not watching it", index)
                    continue
            except NvmlError as exc:
                log.warning("cannot watch XID events on GPU %d: %s", index, exc)
                continue
            self._devices[handle_key(handle)] = (index, uuid)
            self.watched.append(uuid)
        if not self.watched:
            log.warning("no GPU reports XID events; XID events are not watched")
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 5)
            self._thread = None
        if self._event_set is not None:
            try:
                self.api.event_set_free(self._event_set)
            except NvmlError as exc:
                log.debug("freeing the XID event set failed: %s", exc)
            self._event_set = None

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                raw = self.api.event_wait(self._event_set, self.wait_ms)
                failures = 0
            except NvmlError as exc:
                # GPU_IS_LOST and friends: the collector reports the device; keep waiting.
                failures += 1
                if failures in (1, 100):
                    log.warning("waiting for XID events failed: %s", exc)
                self._stop.wait(min(1.0, 0.05 * failures))
                continue
            if raw is None or not raw.event_type & XID_EVENT:
                continue
            index, uuid = self._devices.get(raw.handle_key, (-1, ""))
            event = XidEvent(
                uuid=uuid,
                gpu_index=index,
                xid=raw.data,
                at=time.time(),
                gpu_instance_id=raw.gpu_instance_id,
                compute_instance_id=raw.compute_instance_id,
            )
            self._record(event)

    def _record(self, event: XidEvent) -> None:
        with self._lock:
            codes = self._counts.setdefault(event.uuid, {})
            codes[event.xid] = codes.get(event.xid, 0) + 1
            self._last[event.uuid] = event.xid
        log.info("XID %d on GPU %d (%s)", event.xid, event.gpu_index, event.uuid)
        for callback in self._listeners:
            try:
                callback(event)
            except Exception:
                log.exception("XID listener %r failed", callback)
