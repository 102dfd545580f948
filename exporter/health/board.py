"""The one place the current ``NodeHealth`` lives; readers wait on it for changes.

The checker publishes into it; the device plugin's ListAndWatch streams, the HTTP endpoint
and the metrics read from it. Waiting is a condition variable, so a change reaches a waiting
stream at once instead of at the next poll.
"""

from __future__ import annotations

import threading

from gpuquota.exporter.health.verdict import NodeHealth


class HealthBoard:
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
