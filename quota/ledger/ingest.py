"""The ledger's ingest thread: closed windows from Prometheus into the store, leader only.

The controller starts a :class:`LedgerProcess` (an :class:`Ingester`'s loop in a child
process) when it takes the lease and stops it when it loses it. It has its own store
connection and never touches the watch loop or the Accountant: a slow Prometheus or database
delays the ledger, never an event, and its CPU work does not hold the watch loop's interpreter
lock. Each turn it asks
``rules.plan`` which windows to (re)ingest, fetches each from Prometheus and replaces its rows
in one transaction (ledger/write.py); then it rolls the days up whose windows are final
(``--ledger-rollup-after``, in the days of ``--ledger-rollup-tz``: rules.rollup_days,
LedgerStore.roll_up_day). Failures are logged once per change of state (the same
error again is not logged again) and retried with exponential backoff.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Protocol
from zoneinfo import ZoneInfo

from gpuquota.quota.ledger import rules
from gpuquota.quota.ledger.source import SeriesSamples, fetch_window
from gpuquota.quota.ledger.write import Baseline, LedgerStore
from gpuquota.quota.promhttp import PrometheusError
from gpuquota.quota.prompieces import MAX_SAMPLES_PER_QUERY
from gpuquota.quota.promscope import Scope
from gpuquota.quota.store.db import Store, StoreError, open_store

log = logging.getLogger(__name__)

IDLE_HORIZON = 7 * 86400  # how far back an idle run is traced (idle "since" at most this old)


@dataclass(frozen=True)
class LedgerSettings:
    """The controller's --ledger-* and --idle-* flags."""

    prometheus_url: str
    window: int = 3600
    delay: int = 300
    lookback: int = 3600
    backfill: int = 7 * 86400
    max_gap: int = 60
    idle_threshold: float = 0.05
    idle_for: int = 3600
    rollup_after: int | None = 86400  # None: keep every window's row
    rollup_tz: str = rules.UTC  # the billing time zone whose days are rolled up
    relapse_within: int = 86400  # the fleet history's: a fence this soon after a release
    poll: float = 30.0  # seconds between turns when nothing is due
    timeout: float = 120.0  # one Prometheus query
    max_samples: int = MAX_SAMPLES_PER_QUERY  # one Prometheus answer (no flag; tests lower it)
    backoff: float = 5.0  # first retry after a failure (doubling to 5 minutes)
    # the label naming the cluster in a Prometheus several clusters share
    # (--prometheus-cluster-label); empty: every series is this cluster's
    cluster_label: str = ""

    def scope(self, cluster: str) -> Scope:
        """The series of ``cluster`` in the Prometheus (all of them without a cluster label)."""
        return Scope(self.cluster_label, cluster)


def check(settings: LedgerSettings) -> str | None:
    """What is wrong with the settings, in one line naming the flag; None when nothing."""
    s = settings
    if s.window < 1 or 86400 % s.window:
        # windows under a minute are for demos and tests: a row per series and window
        return f"--ledger-window: {s.window}s must divide a day (e.g. 15m, 1h)"
    if s.delay < s.max_gap:
        return f"--ledger-delay ({s.delay}s) must be at least --ledger-max-gap ({s.max_gap}s): later samples decide a window's coverage at its end"
    if s.lookback < 0 or s.lookback % s.window:
        return f"--ledger-lookback ({s.lookback}s) must be a multiple of --ledger-window ({s.window}s), 0 or more"
    if s.backfill < s.window:
        return f"--ledger-backfill ({s.backfill}s) must be at least --ledger-window ({s.window}s)"
    if s.max_gap <= 0:
        return "--ledger-max-gap must be positive"
    if not 0 < s.idle_threshold <= 1:
        return f"--idle-threshold ({s.idle_threshold}) must be a ratio in (0, 1], e.g. 0.05"
    if s.rollup_after is not None and s.rollup_after < 0:
        return f"--ledger-rollup-after ({s.rollup_after}s) must be 0 or more, or never"
    if s.idle_for < s.window:
        return f"--idle-for ({s.idle_for}s) must be at least --ledger-window ({s.window}s)"
    return rules.check_zone(s.rollup_tz, s.window, time.time())


# windows a first start (or a long downtime) may catch up before it is worth a word: a week
# of 5-minute windows; each window is a few Prometheus queries and a store transaction
CATCH_UP_WINDOWS = 2016


def catch_up_warning(settings: LedgerSettings) -> str | None:
    """A line to log when the back-fill means many windows to catch up (a first start, or
    after downtime): --ledger-backfill 7d of 5 s windows is 120,960 of them, hours of
    queries with no other sign of why; None when the count is ordinary."""
    windows = settings.backfill // settings.window
    if windows <= CATCH_UP_WINDOWS:
        return None
    return (
        f"usage ledger: --ledger-backfill {settings.backfill}s of {settings.window}s windows "
        f"means up to {windows:,} windows to catch up on a first start or after downtime, a few "
        "Prometheus queries each; a shorter --ledger-backfill or a longer --ledger-window "
        "catches up sooner"
    )


@dataclass
class LedgerFacts:
    """What the ledger's metrics read at scrape time (replaced whole, never mutated)."""

    ingested_until: int | None = None
    windows: int = 0
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # reason (prometheus|store) -> count
    idle: tuple[rules.Idle, ...] = ()
    failing: str | None = None
    turns: int = 0  # turns that ingested something (windows and idle allocations done)
    rolled_until: int | None = None  # the end of the last UTC day rolled up
    # samples of the turns' metric rows (controller/metrics.py), by row: attr -> (labels, value)
    extra: dict[str, list[tuple[tuple[str, ...], float]]] = field(default_factory=dict)


# More work of each turn on the ledger's settings, store, process and retries: (store,
# cluster, settings, now, stopped) -> metric samples by controller metric row (a dict, put in
# LedgerFacts.extra), or anything else (ignored). A module-level function (the ledger's
# process is spawned: its turns go to it by reference). The fleet history's is one
# (quota/fleet/ingest.py ``turn``); the controller passes it.
Turn = Callable[[Store, str, "LedgerSettings", float, Callable[[], bool]], object]


class Ingester:
    """Ingests the ledger of one cluster until stopped. ``run_once`` is one turn (the
    ledger's windows, then each of ``turns``)."""

    def __init__(
        self,
        db_url: str,
        cluster: str,
        settings: LedgerSettings,
        *,
        clock: Callable[[], float] = time.time,
        turns: Sequence[Turn] = (),
    ) -> None:
        self.db_url = db_url
        self.turns = tuple(turns)
        self.cluster = cluster
        self.settings = settings
        self.clock = clock
        self.facts = LedgerFacts()
        self.on_facts: Callable[[LedgerFacts], None] | None = None  # each change, if set
        self._stop: threading.Event | EventLike = threading.Event()
        self._thread: threading.Thread | None = None
        self._ledger: LedgerStore | None = None

    # -- one turn ----------------------------------------------------------------------------

    def _store(self) -> LedgerStore:
        if self._ledger is None:
            self._ledger = LedgerStore(open_store(self.db_url), self.cluster)
        return self._ledger

    def run_once(self) -> int:
        """Ingest every window that is due; returns how many. Raises PrometheusError or
        StoreError; windows ingested before the failure stay ingested."""
        s = self.settings
        ledger = self._store()
        progress = ledger.progress()
        until = progress.ingested_until if progress else None
        rolled = progress.rolled_until if progress else None
        if until is not None:
            self._publish(ingested_until=until, rolled_until=rolled)
        due = rules.plan(
            until,
            self.clock(),
            window=s.window,
            delay=s.delay,
            lookback=s.lookback,
            backfill=s.backfill,
            rolled_until=rolled,
        )
        if until is not None and due and due[0] > until:
            log.warning(
                "usage ledger: windows from %d to %d are beyond --ledger-backfill and are skipped",
                until,
                due[0],
            )
        for start in due:
            if self._stop.is_set():
                return 0
            rows = self.ingest_window(start)
            self._publish(
                ingested_until=max(until or 0, start + s.window),
                windows=self.facts.windows + 1,
                rows=self.facts.rows + rows,
            )
            until = self.facts.ingested_until
        if due:
            self.refresh_idle()
            self.roll_up(rolled)
            self._publish(turns=self.facts.turns + 1)
        for turn in self.turns:
            if not self._stop.is_set():
                store = self._store().store
                found = turn(store, self.cluster, self.settings, self.clock(), self._stop.is_set)
                if isinstance(found, dict):  # metric samples by row, for the controller
                    self._publish(extra={**self.facts.extra, **found})
        return len(due)

    def roll_up(self, rolled_until: int | None) -> None:
        """Roll up every day that is due (rules.rollup_days), oldest first, each in its own
        transaction: stopping between two days leaves the rest for the next turn."""
        s = self.settings
        until = self.facts.ingested_until
        if until is None or s.rollup_after is None:
            return
        ledger = self._store()
        first = ledger.first_window_start() if rolled_until is None else None
        days = rules.rollup_days(
            until,
            rolled_until,
            first,
            window=s.window,
            lookback=s.lookback,
            rollup_after=s.rollup_after,
            zone=s.rollup_tz,
        )
        for day in days:
            if self._stop.is_set():
                return
            before, after = ledger.roll_up_day(day, s.rollup_tz)
            log.info(
                "usage ledger: rolled up %s (%s): %d window rows into %d",
                datetime.fromtimestamp(day, ZoneInfo(s.rollup_tz)).strftime("%Y-%m-%d %H:%M"),
                s.rollup_tz,
                before,
                after,
            )
            self._publish(rolled_until=rules.next_day(day, s.rollup_tz))

    def ingest_window(self, start: int) -> int:
        """Fetch and store one window; returns the rows written."""
        s = self.settings
        found = fetch_window(
            s.prometheus_url,
            start,
            s.window,
            s.max_gap,
            s.timeout,
            max_samples=s.max_samples,
            scope=s.scope(self.cluster),
        )
        series = [x for x in found.values() if _inside(x, start, start + s.window)]
        # holders whose allocation ended: their coverage stops at its end
        ended = self._store().holder_ends(
            [(x.holder_kind, x.holder_uid) for x in series if x.holder_kind != "unallocated"]
        )

        def usage_of(series: SeriesSamples, base: Baseline | None) -> rules.Usage | None:
            used, energy = baseline(series, base, start)
            usage = rules.window_usage(
                series.used,
                series.energy,
                start,
                s.window,
                base_used=used,
                base_energy=energy,
                max_gap=s.max_gap,
                energy_only=series.holder_kind == "unallocated",
                held_until=ended.get((series.holder_kind, series.holder_uid)),
            )
            return usage if rules.stored(series.holder_kind, usage) else None

        return self._store().replace_window(start, s.window, series, usage_of)

    def refresh_idle(self) -> None:
        s = self.settings
        ledger = self._store()
        until = self.facts.ingested_until
        if until is None:
            return
        holders = ledger.open_holders()

        def idle(windows: dict[str, list[rules.HolderWindow]]) -> list[rules.Idle]:
            return rules.idle_allocations(
                holders, windows, ingested_until=until, threshold=s.idle_threshold,
                idle_for=s.idle_for,
            )  # fmt: skip

        # the windows of --idle-for first; only allocations idle all that time need more, to
        # say since when (most allocations of a cluster are busy or young)
        recent = rules.align(until - s.idle_for, s.window)
        windows = ledger.holder_windows([h.holder_uid for h in holders], recent)
        found = idle(windows)
        longer = [i.holder_uid for i in found if i.since <= recent]
        if longer:
            windows.update(ledger.holder_windows(longer, until - IDLE_HORIZON))
            found = idle(windows)
        self._publish(idle=tuple(found))

    def _publish(self, **changes: object) -> None:
        facts = dataclasses.replace(self.facts, **changes)  # type: ignore[arg-type]
        if facts == self.facts:
            return
        self.facts = facts
        if self.on_facts is not None:
            self.on_facts(self.facts)

    # -- the thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ledger", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Stop after the window being written, without waiting."""
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop and wait for the thread (a window being written is finished or rolled back)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._ledger is not None:
            self._ledger.store.close()
            self._ledger = None

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                self.run_once()
            except (PrometheusError, StoreError) as exc:
                reason = "prometheus" if isinstance(exc, PrometheusError) else "store"
                errors = dict(self.facts.errors)
                errors[reason] = errors.get(reason, 0) + 1
                message = f"usage ledger: {exc}"
                if message != self.facts.failing:
                    log.error("%s (retrying with backoff)", message)
                self._publish(errors=errors, failing=message)
                backoff = min(300.0, max(self.settings.backoff, backoff * 2))
                self._stop.wait(backoff)
                continue
            except Exception:
                log.exception("usage ledger: unexpected failure (retrying)")
                errors = dict(self.facts.errors)
                errors["internal"] = errors.get("internal", 0) + 1
                self._publish(errors=errors, failing="internal")
                backoff = min(300.0, max(self.settings.backoff, backoff * 2))
                self._stop.wait(backoff)
                continue
            if self.facts.failing is not None:
                log.info("usage ledger: ingesting again (%s resolved)", self.facts.failing)
                self._publish(failing=None)
            backoff = 0.0
            # a short window (the demo's) is looked at more often than every poll
            self._stop.wait(min(self.settings.poll, max(1.0, self.settings.window / 4)))


class EventLike(Protocol):
    """threading.Event or multiprocessing's Event."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class LedgerProcess:
    """The leader's ledger ingestion, in a child process of its own.

    Decoding Prometheus' answers and computing the windows is CPU work in Python; in a thread
    of the controller's process it would take the interpreter lock from the watch loop for
    as long (bench/ledger.py measured events delayed by hundreds of milliseconds on a busy
    2-core machine). In a child process (niced, so the kernel prefers the watch loop too)
    it shares nothing with the watch path but the store. Its facts (for the metrics) come
    back through a pipe after each change; it exits when asked to, when the controller's
    process is gone, or when the pipe breaks."""

    NICE = 10

    def __init__(
        self, db_url: str, cluster: str, settings: LedgerSettings, turns: Sequence[Turn] = ()
    ) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a threaded process
        self.facts = LedgerFacts()
        receive, send = ctx.Pipe(duplex=False)
        self._receive = receive
        self._stop = ctx.Event()
        self._proc = ctx.Process(
            target=_child,
            args=(db_url, cluster, settings, send, self._stop, os.getpid(), tuple(turns)),
            name="gpuquota-ledger",
            daemon=True,
        )
        self._send = send
        self._settings = settings
        self._reader = threading.Thread(target=self._read, name="ledger-facts", daemon=True)

    def start(self) -> None:
        self._proc.start()
        log.info(
            "usage ledger: ingesting from %s in process %d",
            self._settings.prometheus_url,
            self._proc.pid,
        )
        self._send.close()  # the child's end: the pipe breaks when the child is gone
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                facts = self._receive.recv()
            except (EOFError, OSError):
                return
            if isinstance(facts, LedgerFacts):
                self.facts = facts

    def request_stop(self) -> None:
        """Stop after the window being written, without waiting."""
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop and wait for the child; one still busy after ``timeout`` is terminated (its
        open transaction rolls back: the window is ingested again by the next leader)."""
        self._stop.set()
        if self._proc.pid is None:
            return
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._receive.close()


def _child(
    db_url: str,
    cluster: str,
    settings: LedgerSettings,
    send: Connection,
    stop: EventLike,
    parent: int,
    turns: Sequence[Turn] = (),
) -> None:
    """The ledger process: Ingester's loop, facts to the parent after each change."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Ctrl-C in a terminal reaches the whole process group: the controller stops the child
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(LedgerProcess.NICE)
    ingester = Ingester(db_url, cluster, settings, turns=turns)
    ingester._stop = stop

    def publish(facts: LedgerFacts) -> None:
        try:
            send.send(facts)
        except (OSError, ValueError):  # the controller is gone
            stop.set()

    def orphaned() -> None:
        while not stop.wait(1.0):
            if os.getppid() != parent:
                stop.set()

    ingester.on_facts = publish
    threading.Thread(target=orphaned, name="ledger-parent", daemon=True).start()
    try:
        ingester._run()
    finally:
        if ingester._ledger is not None:
            ingester._ledger.store.close()


def baseline(
    series: SeriesSamples, stored: Baseline | None, start: int
) -> tuple[float | None, float | None]:
    """The counters' baselines of a series' window at ``start``: the stored end of its
    previous window when that is the window just before; else, when the series has a sample
    just before ``start`` (its previous window was never ingested: beyond --ledger-backfill,
    or before the ledger began), None, so that the increase starts at that sample; else the
    stored end however old (the agent was down: what it counted meanwhile lands here), else
    None (a new series: from 0, rules.increase)."""
    if stored is not None:
        window_start, window_seconds, end_used, end_energy = stored
        # samples are in time order: the first says whether any came before
        before = any(samples[0][0] < start for samples in (series.used, series.energy) if samples)
        if window_start + window_seconds == start or not before:
            return (end_used or 0.0, end_energy or 0.0)
    return (None, None)


def _inside(series: SeriesSamples, start: int, end: int) -> bool:
    return rules.has_samples(series.used, start, end) or rules.has_samples(
        series.energy, start, end
    )
