"""The health checker: feeds snapshots, XID events and time into the rules on its own thread.

The collector's subscribe() callback, the XID watcher's listener and ``restore`` (the
fences the API writers read back at start) only put the input on a queue, so neither the collection loop nor the NVML event thread ever waits on health work.
The worker applies each input to the ``DeviceTracker`` (exporter/health/engine.py), wakes up
by itself when an event reason's quiet period runs out, and publishes every new
``NodeHealth`` on the ``VerdictBoard`` that the metrics, the HTTP endpoint and the device
plugin read.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from gpuquota.exporter.health.board import VerdictBoard
from gpuquota.exporter.health.engine import DeviceTracker, Fence
from gpuquota.exporter.health.table import RulesConfig
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.snapshot import NodeSnapshot

log = logging.getLogger(__name__)

MAX_SLEEP_S = 1.0

HealthListener = Callable[[NodeHealth, NodeHealth], None]  # (before, after)


class XidLike(Protocol):
    """What the checker reads from gpuquota.exporter.xid.XidEvent."""

    @property
    def uuid(self) -> str: ...
    @property
    def xid(self) -> int: ...
    @property
    def at(self) -> float: ...
    @property
    def gpu_instance_id(self) -> int | None: ...
    @property
    def compute_instance_id(self) -> int | None: ...


_STOP = object()


class _Restore:
    def __init__(self, fences: tuple[Fence, ...]) -> None:
        self.fences = fences
        self.done = threading.Event()


def boot_time(stat: str = "/proc/stat") -> float | None:
    """Unix time this machine booted (``btime`` of /proc/stat); None where unknown."""
    try:
        with open(stat, encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class CheckerThread:
    def __init__(
        self,
        config: RulesConfig,
        board: VerdictBoard | None = None,
        clock: Callable[[], float] = time.time,
        booted_at: float | None = None,
    ) -> None:
        self.tracker = DeviceTracker(config, boot_time=booted_at)
        self.board = board or VerdictBoard()
        self._clock = clock
        self._inputs: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._listeners: list[HealthListener] = []
        self._thread: threading.Thread | None = None

    # -- inputs: cheap, never block -------------------------------------------------------

    def on_snapshot(self, snapshot: NodeSnapshot) -> None:
        self._inputs.put(snapshot)

    def on_xid(self, event: XidLike) -> None:
        self._inputs.put(event)

    def restore(self, fences: list[Fence], timeout: float = 10.0) -> None:
        """Hands the fences an API writer read back at start to the tracker, and returns once
        applied (so the writer never acts on a verdict that has not seen them)."""
        item = _Restore(tuple(fences))
        self._inputs.put(item)
        item.done.wait(timeout)

    def add_listener(self, listener: HealthListener) -> None:
        """Called on the checker's thread after each change (keep it short, or hand off)."""
        self._listeners.append(listener)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="health-checker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._inputs.put(_STOP)
            self._thread.join()
            self._thread = None

    def current(self) -> NodeHealth:
        return self.board.current()

    # -- worker -----------------------------------------------------------------------------

    def _timeout(self) -> float:
        expiry = self.tracker.next_expiry()
        if expiry is None:
            return MAX_SLEEP_S
        return min(MAX_SLEEP_S, max(0.0, expiry - self._clock()))

    def _run(self) -> None:
        while True:
            try:
                item = self._inputs.get(timeout=self._timeout())
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                self._apply(item)
            except Exception:  # a bad input must not kill health checking
                log.exception("health checker failed on %r", item)
            finally:
                if isinstance(item, _Restore):
                    item.done.set()

    def _apply(self, item: object) -> None:
        before = self.tracker.health
        now = self._clock()
        if isinstance(item, NodeSnapshot):
            after = self.tracker.observe_snapshot(item, now)
        elif isinstance(item, _Restore):
            after = self.tracker.restore(item.fences, now)
            if item.fences:
                log.info(
                    "holding %d fence(s) set before this start: %s",
                    len(item.fences),
                    ", ".join(f"{f.uuid} ({f.action.label})" for f in item.fences),
                )
            if not self.board.ready:  # the first snapshot's verdict will carry them
                return
        elif item is not None:
            event: XidLike = item  # type: ignore[assignment]
            if not event.uuid:  # the watcher could not tell which GPU: nothing to pin it on
                log.warning(
                    "XID %d on an unidentified GPU ignored by the health checker", event.xid
                )
                return
            after = self.tracker.observe_xid(
                event.uuid, event.xid, event.at, event.gpu_instance_id, event.compute_instance_id
            )
        else:
            after = self.tracker.expire(now)
        first = isinstance(item, NodeSnapshot) and not self.board.ready
        if after.generation != before.generation or first:
            self.board.publish(after)
            for listener in self._listeners:
                try:
                    listener(before, after)
                except Exception:
                    log.exception("health listener %r failed", listener)
