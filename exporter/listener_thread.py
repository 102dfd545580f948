"""A health listener that does its API writes on its own thread.

The node-status updater and the DeviceTaintRule publisher both take the health verdict from
the checker's thread (which must never wait on the API server) and apply it on a thread of
their own, woken through one condition. This is that shared life cycle (start, wake, stop)
and the shared way a write that fails is handled: one log line per failure, a jittered,
bounded back-off (gpuquota/kube/backoff.py), and the streak of failures and the time of the
last success as metrics (``gpuquota_exporter_api_write_*``, alert GPUExporterCannotWriteToApi),
read at scrape time through ``status()`` (exporter/health/publishing.py).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from gpuquota.exporter.health.publishing import ApiWriterStatus
from gpuquota.kube.backoff import Backoff

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 300  # an API error in the log: one line, this long at most


def parse_time(text: Any) -> float | None:
    """An RFC 3339 time from the API server as unix time; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def one_line(exc: BaseException) -> str:
    """An exception as one short log line (no multi-line HTTP dumps)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class ListenerThread:
    """Subclasses implement ``_run`` (waiting on ``self._cond`` until ``self._stopping`` or
    their own work) and notify ``self._cond`` when there is new work; after each attempt to
    write they call ``_succeeded()`` or ``_failed(what, exc)`` (which says how long to wait)."""

    def __init__(
        self, name: str, join_timeout: float | None = None, max_backoff_s: float = 30.0
    ) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._stopping = False
        self._join_timeout = join_timeout
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._backoff = Backoff(base=0.5, cap=max_backoff_s)
        self.consecutive_failures = 0
        self.failures_total = 0
        self.last_success: float | None = None  # unix time

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

    # -- the outcome of each write

    def _succeeded(self) -> None:
        if self.consecutive_failures:
            log.info(
                "%s: writing again after %d failed attempts", self.name, self.consecutive_failures
            )
        self.consecutive_failures = 0
        self.last_success = time.time()
        self._backoff.reset()

    def _failed(self, what: str, exc: BaseException) -> float:
        """Counts and logs (one line) a failed write; the seconds to wait before the next."""
        self.consecutive_failures += 1
        self.failures_total += 1
        delay = self._backoff.next()
        log.warning(
            "%s (failure %d in a row, retrying in %.1fs): %s",
            what,
            self.consecutive_failures,
            delay,
            one_line(exc),
        )
        return delay

    def _pause(self, seconds: float) -> None:
        """Waits ``seconds`` or until stopped."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, seconds)

    def status(self) -> ApiWriterStatus:
        return ApiWriterStatus(self.consecutive_failures, self.failures_total, self.last_success)
