"""The controller loop: drain the watch loops' queue into the Accountant, flush in batches.

One thread owns the Accountant. It flushes every ``flush_every`` events or ``flush_interval``
seconds; a failed write (database down) is counted and retried with back-off while events
keep being applied in memory — the Accountant keeps everything unwritten pending — and the
backlog is written in one go when the database answers again. A heartbeat (with the
resourceVersions seen) goes with each flush while every kind is current and its watch open
(gpuquota/kube/watch.py), whether or not anything changes: a restart resumes the watches from
those versions, and closes what vanished meanwhile no later than it. After a restart, and
during a relist, it does not advance; ``gpuquota_controller_synced`` says the same.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from urllib3.exceptions import HTTPError

from gpuquota.kube.backoff import Backoff
from gpuquota.kube.client import ApiStatusError, Kube
from gpuquota.kube.messages import Event, Listed, Message, Resync, Synced, put
from gpuquota.kube.watch import WatchLoop
from gpuquota.quota import accounting as acc
from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.accounting.rules.claims import names_claims
from gpuquota.quota.controller.metrics import ControllerMetrics
from gpuquota.quota.store.db import StoreError

log = logging.getLogger(__name__)


QUEUE_SIZE = 2000  # messages between the watch loops and the Accountant


class StartupError(RuntimeError):
    """The controller cannot start (API server unreachable): one line naming the cause."""


@dataclass(frozen=True)
class Settings:
    flush_every: int = 1000
    flush_interval: float = 5.0
    startup_timeout: float = 30.0


def accounts_pod(pod: Mapping[str, object], config: acc.AccountingConfig) -> bool:
    """Whether the accounting cares about this pod: GPU requests (which cannot change later)
    or ResourceClaims. The Pod watch drops the others on arrival."""
    try:
        return bool(acc.effective_units(pod, config)) or names_claims(pod)
    except acc.AccountingError:
        return True  # let the Accountant report it


class LoopMetrics:
    """The watch loops' counts (gpuquota.kube.watch.WatchMetrics) as the controller's metrics."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics

    def event(self, kind: str, event_type: str) -> None:
        self.metrics.events.labels(kind, event_type).inc()

    def ignored(self, kind: str) -> None:
        self.metrics.ignored.labels(kind).inc()

    def restart(self, kind: str, reason: str) -> None:
        self.metrics.watch_restarts.labels(kind, reason).inc()

    def relist(self, kind: str) -> None:
        self.metrics.relists.labels(kind).inc()


class Controller:
    def __init__(
        self,
        kube: Kube,
        accountant: Accountant,
        metrics: ControllerMetrics,
        settings: Settings = Settings(),
        clock: Callable[[], float] = time.time,
    ):
        self.kube, self.acct, self.metrics, self.settings = kube, accountant, metrics, settings
        accountant.on_gap = lambda kind, reason: metrics.gaps.labels(kind, reason).inc()
        self.clock = clock
        self.stop_event = threading.Event()
        # bounded: a burst of events waits in the socket, not in memory
        self.queue: queue.Queue[Message] = queue.Queue(maxsize=QUEUE_SIZE)
        self._startup_error: StartupError | None = None
        self.loops: list[WatchLoop] = []
        self.synced = threading.Event()
        self._since_flush = 0
        self._next_flush = 0.0
        self._last_ok = clock()
        self._db_backoff = Backoff(base=0.5, cap=30.0)
        # held while this thread changes the Accountant: a scrape reads its facts meanwhile
        self.facts_lock = threading.Lock()
        metrics.facts.read_from(accountant, self.facts_lock)
        self.watched: tuple[str, ...] = Kube.KINDS

    def stop(self) -> None:
        self.stop_event.set()

    # -- start

    def start_watches(self) -> None:
        """Start one loop per kind, in order (nodes first, pods last), each once the previous
        one has listed or resumed; "synced" once every kind is proven current.

        Raises StartupError when a kind cannot be listed within the startup timeout."""
        stored = self.acct.resource_versions
        known_at = self.acct.heartbeat_at
        started = time.monotonic()
        self.watched = self._kinds()
        for kind in self.watched:
            loop = WatchLoop(
                kind,
                self.kube,
                self.queue,
                self.stop_event,
                LoopMetrics(self.metrics),
                stored.get(kind),
                keep=self._has_gpus if kind == "Pod" else None,
                known_at=known_at,
            )
            loop.start()
            self.loops.append(loop)
            while not loop.started.wait(0.1):
                if self.stop_event.is_set():
                    return
                if time.monotonic() - started > self.settings.startup_timeout:
                    self.stop()
                    raise StartupError(
                        f"cannot list {kind}s from the Kubernetes API server at {self.kube.host}: "
                        f"{loop.last_error or 'no answer'}"
                    )
        # a resumed watch proves itself within seconds (Timeouts.proof); one that got 410
        # relists first, however long that takes
        for loop in self.loops:
            while not loop.current.wait(0.1):
                if self.stop_event.is_set():
                    return
        put(self.queue, Synced(), self.stop_event)

    def _kinds(self) -> tuple[str, ...]:
        """The kinds to watch, in order: DRA's (before the pods) where the cluster has them."""
        try:
            why = self.kube.dra_unavailable()
        except (ApiStatusError, HTTPError, OSError, ValueError) as exc:
            why = f"cannot tell whether resource.k8s.io/v1 is served ({exc})"
        if why is not None:
            log.warning("DRA ResourceClaims are not accounted: %s", why)
            self.metrics.dra_watched.set(0)
            return Kube.KINDS
        self.metrics.dra_watched.set(1)
        pods = Kube.KINDS.index("Pod")
        return (*Kube.KINDS[:pods], *Kube.DRA_KINDS, *Kube.KINDS[pods:])

    def _start(self) -> None:
        try:
            self.start_watches()
        except StartupError as exc:
            self._startup_error = exc

    def _has_gpus(self, pod: dict[str, object]) -> bool:
        return accounts_pod(pod, self.acct.config)

    # -- run

    def run(self) -> None:
        """Start the watches, then apply and flush until stop(); a last flush on the way out."""
        t0 = time.monotonic()
        # the loops start one after the other while this thread already drains the queue;
        # every initial list is queued ahead of the "synced" marker
        threading.Thread(target=self._start, name="start-watches", daemon=True).start()
        while not self.stop_event.is_set():
            try:
                msg: Message | None = self.queue.get(timeout=0.2)
            except queue.Empty:
                msg = None
            while msg is not None:
                if isinstance(msg, Synced):
                    elapsed = time.monotonic() - t0
                    self.synced.set()
                    self.metrics.sync_seconds.set(elapsed)
                    log.info("synced in %.1fs", elapsed)
                    with self.facts_lock:
                        self._flush()
                else:
                    with self.facts_lock:
                        self._handle(msg)
                if (
                    self._since_flush >= self.settings.flush_every
                    or time.monotonic() >= self._next_flush
                ):
                    break
                try:
                    msg = self.queue.get_nowait()
                except queue.Empty:
                    msg = None
            with self.facts_lock:
                self._maybe_flush()
        if self._startup_error is not None:
            raise self._startup_error
        with self.facts_lock:
            self._flush()

    def _handle(self, msg: Listed | Resync | Event) -> None:
        try:
            match msg:
                case Event(kind, observed_at, event_type, obj):
                    self.acct.apply(event_type, obj, observed_at)
                    self.metrics.events.labels(kind, event_type).inc()
                    self._since_flush += 1
                case Resync(kind, observed_at, items, version, gap_from):
                    self.acct.resync(kind, items, observed_at, version, gap_from)
                    self._since_flush += len(items)
                case Listed(kind, observed_at, items):  # facts only, nothing closes
                    for obj in items:
                        # the watch resumes from the stored version, not the objects' own
                        try:
                            self.acct.apply("MODIFIED", obj, observed_at, from_watch=False)
                        except acc.AccountingError as exc:  # the rest of the list still counts
                            self.metrics.accounting_errors.labels(kind).inc()
                            log.warning("%s skipped: %s", kind, exc)
                    self._since_flush += len(items)
        except acc.AccountingError as exc:
            self.metrics.accounting_errors.labels(msg.kind).inc()
            log.warning("%s skipped: %s", msg.kind, exc)

    # -- flushing

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now >= self._next_flush or (
            self._since_flush >= self.settings.flush_every and not self._db_backoff.attempt
        ):
            self._flush()
        self.metrics.flush_lag.set(max(0.0, self.clock() - self._last_ok))

    def current(self) -> bool:
        """Every kind proven current and watched: the controller knows the present."""
        return self.synced.is_set() and all(loop.healthy for loop in self.loops)

    def lagging(self) -> list[str]:
        """The kinds not (yet) proven current or not watched now, for readiness."""
        lagging = [loop.kind for loop in self.loops if not loop.healthy]
        missing = [kind for kind in self.watched if kind not in {x.kind for x in self.loops}]
        return lagging + missing

    def _flush(self) -> None:
        now = time.monotonic()
        current = self.current()
        self.metrics.synced.set(1 if current else 0)
        if current:
            self.acct.heartbeat(int(self.clock()))
        try:
            written = self.acct.flush()
        except StoreError as exc:
            self.metrics.db_errors.inc()
            self.metrics.pending_rows.set(self.acct.pending())
            delay = self._db_backoff.next()
            self._next_flush = now + delay
            log.warning(
                "store write failed (%s); keeping %d rows, retrying in %.1fs",
                exc,
                self.acct.pending(),
                delay,
            )
            return
        if self._db_backoff.attempt:
            log.info("store is back: wrote the %d rows kept during the outage", written)
        self._db_backoff.reset()
        self._since_flush = 0
        self._next_flush = now + self.settings.flush_interval
        self._last_ok = self.clock()
        self.metrics.last_flush.set(self._last_ok)
        self.metrics.pending_rows.set(0)
