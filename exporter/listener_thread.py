"""A health listener that does its API writes on its own thread.

The node-status updater and the DeviceTaintRule publisher both take the health verdict from
the checker's thread (which must never wait on the API server) and apply it on a thread of
their own, woken through one condition. This is that shared life cycle: start, wake, stop.
"""

from __future__ import annotations

import threading


class ListenerThread:
    """Subclasses implement ``_run`` (waiting on ``self._cond`` until ``self._stopping`` or
    their own work) and notify ``self._cond`` when there is new work."""

    def __init__(self, name: str, join_timeout: float | None = None) -> None:
        self._cond = threading.Condition()
        self._stopping = False
        self._join_timeout = join_timeout
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=self._join_timeout)
