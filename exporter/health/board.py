"""The one place the current ``NodeHealth`` lives; readers wait on it for changes.

The checker thread publishes into it; every publisher of the verdict reads from it: the
metrics (exporter/expose/scrape.py), /health (route.py), the device plugin's ListAndWatch
streams, and through the checker's listeners node status and DeviceTaintRules. Waiting is a condition variable, so a change reaches a waiting
stream at once instead of at the next poll.
"""

from __future__ import annotations

import threading

from gpuquota.exporter.health.verdict import NodeHealth


class VerdictBoard:
    def __init__(self, initial: NodeHealth | None = None) -> None:
        self._cond = threading.Condition()
        self._health = initial or NodeHealth((), 0, 0.0)
        self._ready = initial is not None

    def publish(self, health: NodeHealth) -> None:
        with self._cond:
            self._health = health
            self._ready = True
            self._cond.notify_all()

    def current(self) -> NodeHealth:
        with self._cond:
            return self._health

    def verdict(self) -> NodeHealth | None:
        """The verdict of this moment, None before the first (what a scrape renders)."""
        with self._cond:
            return self._health if self._ready else None

    @property
    def ready(self) -> bool:
        """True once a first health picture (from a first snapshot) has been published."""
        with self._cond:
            return self._ready

    def wait_for_change(self, generation: int, timeout: float) -> NodeHealth:
        """The current health once its generation differs from ``generation`` (or on timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._health.generation != generation, timeout)
            return self._health
