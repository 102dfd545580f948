"""The collect loop: one round per interval, NVML read into one immutable NodeSnapshot.

Each round hands every GPU's reader thread the readings due (exporter/collect/schedule.py),
waits for them until ``read_timeout``, assembles the NodeSnapshot from each GPU's last
complete reading (exporter/collect/reader.py), runs the enrichers (pod attribution, per-pod
usage) on it, stores it as ``latest()`` and hands it to the subscribers (the health checker,
the renderer's render-ahead). Scrapes only ever read ``latest()``.

Concurrency: each GPU is read by its own thread (NVML releases the GIL inside its calls, and
on a real GPU some calls take milliseconds). A GPU whose call hangs keeps its last reading
(its ``gpuquota_exporter_read_age_seconds`` grows), holds up no other GPU, and is published
as ERROR once it is ``STALL_ROUNDS`` read timeouts late.

Cadence: ``collect_once`` reads every tier of every GPU; the background loop reads the fast
tier every round and each GPU's slow tier (GPM's sample pair with it) on its turn, a few GPUs
per round, so no round carries every GPU's slow reads at once. ``start`` begins with the
start-up rounds: every GPU read in full (identity and every tier), ``STARTUP_GPUS_PER_ROUND``
GPUs a round, back to back; nothing is published (``latest()`` stays None, so /readyz says
not ready) until the round that reads the last of them, so the first snapshot carries every
tier of every GPU and no round carries every GPU's first reading at once. Round watchers
(``watch_rounds``) hear of every round, start-up rounds included.

Node-wide failures stay partial: when nvmlDeviceGetCount fails, the last known device list is
read as usual (``ok`` is False for the round; only GPUs that cannot be read are marked).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuquota.exporter.collect.nvml import NvmlApi, NvmlError
from gpuquota.exporter.collect.profiling import PROCESS_SAMPLE_PERIOD, ProfilingReader
from gpuquota.exporter.collect.reader import NvmlReader
from gpuquota.exporter.collect.schedule import (
    FAST_AND_SLOW,
    ask_cycle_rounds,
    cycle_rounds,
    on_turn,
    startup_turn,
    tiers_due,
)
from gpuquota.exporter.collect.tiers import Tier
from gpuquota.exporter.collect.xid import XidWatcher
from gpuquota.exporter.snapshot import DeviceSnapshot, DeviceState, NodeSnapshot

log = logging.getLogger(__name__)

Enricher = Callable[[NodeSnapshot], NodeSnapshot]
Subscriber = Callable[[NodeSnapshot], None]

SLOW_INTERVALS = 5  # default slow_interval: this many collection intervals
WORKER_IDLE_S = 120.0  # a GPU reader thread idle this long ends (a new one starts on demand)
STALL_ROUNDS = 3  # a GPU whose read is this many read timeouts late is published as ERROR


@dataclass(frozen=True, slots=True)
class ReadJob:
    """What one GPU's reader reads in one round."""

    tiers: frozenset[Tier]
    processes: bool  # its turn to ask for per-process utilisation


@dataclass(frozen=True, slots=True)
class RoundDone:
    """One round the loop ran, as its round watchers hear of it (after its NVML reads, before
    its snapshot is enriched and published)."""

    round: int  # the collection it is or leads to (every start-up round: the first's, 1)
    start_up: bool  # a start-up round: its GPUs were read for the first time, in full
    published: bool  # it ends in a snapshot (False: a start-up round before the last)
    seconds: float  # its wall time: the device count and its reads (until read_timeout)


RoundWatcher = Callable[[RoundDone], None]
FULL_JOB = ReadJob(tiers=FAST_AND_SLOW, processes=True)


class _ReaderThread:
    """One GPU's reader thread: takes one job at a time; a round waits for it until its
    deadline and otherwise goes on without it (the job finishes whenever NVML answers)."""

    def __init__(self, name: str, work: Callable[[ReadJob], None]) -> None:
        self._name = name
        self._work = work
        self._cv = threading.Condition()
        self._job: ReadJob | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self.started_at = 0.0  # time.monotonic() of the current (or last) job

    def busy_for(self) -> float:
        """Seconds the current job has been running; 0 when idle."""
        with self._cv:
            return time.monotonic() - self.started_at if self._busy else 0.0

    def submit(self, job: ReadJob) -> bool:
        """Starts `job`; False while the previous job has not finished."""
        with self._cv:
            if self._busy:
                return False
            self._busy = True
            self._job = job
            self.started_at = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return True

    def wait(self, deadline: float) -> bool:
        """Waits until the job is done or time.monotonic() passes `deadline`."""
        with self._cv:
            while self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cv.wait(remaining)
        return True

    def _loop(self) -> None:
        while True:
            with self._cv:
                if self._job is None and not self._cv.wait_for(
                    lambda: self._job is not None, WORKER_IDLE_S
                ):
                    self._thread = None  # idle: end; submit() starts a new one
                    return
                job, self._job = self._job, None
            try:
                assert job is not None
                self._work(job)
            except Exception:  # one bad read must not kill the GPU's reader
                log.exception("reading %s failed", self._name)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


class CollectLoop:
    """Reads NVML in a background thread; one immutable NodeSnapshot per interval."""

    def __init__(
        self,
        api: NvmlApi,
        *,
        interval: float = 1.0,
        hostname: str | None = None,
        xid: XidWatcher | None = None,
        slow_interval: float | None = None,
        read_timeout: float | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        if slow_interval is not None and slow_interval < interval:
            raise ValueError("slow_interval must be at least the interval")
        self.api = api
        self.interval = interval
        self.slow_interval = (
            slow_interval if slow_interval is not None else SLOW_INTERVALS * interval
        )
        # how long a round waits for a GPU before publishing its last reading instead
        self.read_timeout = read_timeout if read_timeout is not None else max(interval, 1.0)
        self.hostname = hostname or socket.gethostname()
        self.xid = xid
        self.started_at = time.time()  # the counters' epoch (gpuquota_exporter_start_time_seconds)
        self._enrichers: list[Enricher] = []
        self._subscribers: list[Subscriber] = []
        self._watchers: list[RoundWatcher] = []
        self._latest: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reader = NvmlReader(api)
        self._threads: list[_ReaderThread] = []
        self._collections = 0
        self._last_success: float | None = None
        self._driver: tuple[str | None, str | None, int | None] | None = None
        # rounds per slow cycle, and between two per-process utilisation questions
        self._slow_cycle = cycle_rounds(self.slow_interval, interval)
        self._processes_cycle = ask_cycle_rounds(PROCESS_SAMPLE_PERIOD, interval)

    @property
    def profiling(self) -> ProfilingReader:
        """GPM and per-process utilisation (the reader's; a test may give it a clock)."""
        return self.reader.profiling

    @profiling.setter
    def profiling(self, value: ProfilingReader) -> None:
        self.reader.profiling = value

    # --- wiring ------------------------------------------------------------------------------
    def add_enricher(self, fn: Enricher) -> None:
        """``fn(snapshot) -> snapshot`` runs after every collection (e.g. adds ``pods``)."""
        self._enrichers.append(fn)

    def subscribe(self, callback: Subscriber) -> None:
        """``callback(snapshot)`` runs in the collect thread after every collection."""
        self._subscribers.append(callback)

    def watch_rounds(self, callback: RoundWatcher) -> None:
        """``callback(RoundDone)`` runs in the collecting thread after every round's reads,
        start-up rounds included (the benchmark times and counts each round with it)."""
        self._watchers.append(callback)

    def latest(self) -> NodeSnapshot | None:
        return self._latest

    # --- the loop ----------------------------------------------------------------------------
    def start(self) -> None:
        """The start-up rounds (so ``latest()`` is set, every tier of every GPU read), then
        keep collecting in the background."""
        self.start_up()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-collector", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self._collect_and_publish(full=False)
            except Exception:  # never let one bad round kill the loop
                log.exception("collection failed")
            # Fixed rate; after a stall skip the missed rounds instead of bursting.
            next_at = max(next_at + self.interval, time.monotonic())

    def collect_once(self) -> NodeSnapshot:
        """Read NVML now (every tier of every GPU, in one round), enrich, publish and return
        the snapshot."""
        snapshot = self._collect_and_publish(full=True)
        assert snapshot is not None  # a round outside start-up always publishes
        return snapshot

    def start_up(self) -> NodeSnapshot:
        """Reads every GPU in full (identity, every tier), ``STARTUP_GPUS_PER_ROUND`` per
        round, back to back, and publishes the first snapshot in the round that reads the
        last of them (exporter/collect/schedule.py, ``startup_turn``); returns it."""
        done: set[int] = set()
        while True:
            snapshot = self._collect_and_publish(full=True, start_up=done)
            if snapshot is not None:
                return snapshot

    def _collect_and_publish(
        self, *, full: bool, start_up: set[int] | None = None
    ) -> NodeSnapshot | None:
        with self._lock:
            collected = self._collect(full, start_up)
            if collected is None:  # a start-up round before the last: nothing to publish
                return None
            snapshot = collected
            for enrich in self._enrichers:
                try:
                    snapshot = enrich(snapshot)
                except Exception:
                    log.exception("enricher %r failed; publishing without it", enrich)
            self._latest = snapshot
        for callback in self._subscribers:
            try:
                callback(snapshot)
            except Exception:
                log.exception("snapshot subscriber %r failed", callback)
        return snapshot

    # --- reading NVML ------------------------------------------------------------------------
    def _collect(self, full: bool, start_up: set[int] | None = None) -> NodeSnapshot | None:
        """One round. `start_up`: the GPUs read in earlier start-up rounds; this round reads
        the next few in full (updating the set) and only the round reading the last of them
        returns a snapshot (None before)."""
        started = time.perf_counter()
        round_no = self.reader.round = self._collections + 1
        reader = self.reader
        ok = True
        try:
            count = self.api.device_count()
            if self._driver is None:
                self._driver = (
                    self.api.driver_version(),
                    self.api.nvml_version(),
                    self.api.cuda_driver_version(),
                )
        except NvmlError as exc:
            # Keep the last known device list: the GPUs' handles are still good, and most
            # likely every GPU still answers. Only what cannot be read is marked.
            reader.count_error(exc.function)
            log.warning("NVML node-wide call failed this round: %s", exc)
            ok = False
            count = reader.known
        reader.ensure(count)
        while len(self._threads) < count:
            index = len(self._threads)
            self._threads.append(
                _ReaderThread(f"nvml-gpu-{index}", functools.partial(self._read, index))
            )
        now = time.time()
        if start_up is not None:
            turn = startup_turn(count, start_up)
            start_up.update(turn)
            jobs = dict.fromkeys(turn, FULL_JOB)
        else:
            jobs = {index: self._job(index, round_no, now, full) for index in range(count)}
        submitted = [self._threads[i] for i, job in jobs.items() if self._threads[i].submit(job)]
        deadline = time.monotonic() + self.read_timeout
        for worker in submitted:
            worker.wait(deadline)
        if start_up is not None and startup_turn(count, start_up):
            self._tell(RoundDone(round_no, True, False, time.perf_counter() - started))
            return None  # GPUs not read yet: the first snapshot waits for them
        self._collections = round_no
        devices: list[DeviceSnapshot] = []
        stall_after = STALL_ROUNDS * max(self.interval, self.read_timeout)
        for index in range(count):
            stuck = self._threads[index].busy_for()
            if stuck > stall_after:
                # NVML has not answered for this GPU for several rounds: it is not read, so
                # say so (health marks it); the other GPUs are published as read
                why = (("collector", f"NVML has not answered for {stuck:.0f} s"),)
                devices.append(reader.unreadable(index, DeviceState.ERROR, why))
                continue
            got = reader.devices(index)
            devices.extend(
                got if got is not None else [reader.unreadable(index, DeviceState.ERROR, ())]
            )
        now = time.time()
        if ok:
            self._last_success = now
        xid_counts = self.xid.counts() if self.xid is not None else {}
        xid_last = self.xid.last() if self.xid is not None else {}
        driver, nvml_version, cuda = self._driver or (None, None, None)
        errors_total = reader.errors_total()
        seconds = time.perf_counter() - started
        self._tell(RoundDone(round_no, start_up is not None, True, seconds))
        return NodeSnapshot(
            hostname=self.hostname,
            driver_version=driver,
            nvml_version=nvml_version,
            cuda_driver_version=cuda,
            devices=tuple(devices),
            collected_at=now,
            collection_seconds=seconds,
            xid_counts=xid_counts,
            xid_last=xid_last,
            ok=ok,
            nvml_errors_total=errors_total,
            last_success_at=self._last_success,
            collections_total=self._collections,
            started_at=self.started_at,
            nvml_calls=self.api.call_stats(),
        )

    def _job(self, index: int, round_no: int, now: float, full: bool) -> ReadJob:
        """What GPU `index` reads in round `round_no` (schedule.py's rules)."""
        slow_at = self.reader.read_at(index, Tier.SLOW)
        return ReadJob(
            tiers=tiers_due(
                index,
                round_no,
                self._slow_cycle,
                None if slow_at is None else now - slow_at,
                self.slow_interval,
                full=full,
            ),
            processes=full or on_turn(index, round_no, self._processes_cycle),
        )

    def _tell(self, done: RoundDone) -> None:
        for callback in self._watchers:
            try:
                callback(done)
            except Exception:
                log.exception("round watcher %r failed", callback)

    def _read(self, index: int, job: ReadJob) -> None:
        self.reader.read_gpu(index, job.tiers, processes_turn=job.processes)
