"""The collect step: a background loop that reads NVML into one NodeSnapshot per interval.

Each round reads every GPU (and its MIG instances) through ``NvmlApi``, runs the enrichers
(pod attribution) on the result, stores it as ``latest()`` and hands it to the subscribers
(the health checker). Scrapes only ever read ``latest()``.

Concurrency: each GPU is read by its own worker thread (NVML releases the GIL inside its
calls, and on a real GPU some calls take milliseconds). A round hands every idle worker its
GPU's reads and waits for them until ``read_timeout``; a GPU whose call hangs keeps its last
reading (its ``gpuquota_exporter_read_age_seconds`` grows) and holds up no other GPU.

Cadence: each NVML value is read at the tier its metric rows declare in exporter/expose/metrics.py
(fast: every round; slow: every ``slow_interval``; once: with the identity). ``collect_once``
reads every tier; the background loop only what is due. Counters replace samples where NVML
has them: PCIe bytes/s is the rate between two readings of the cumulative byte counters.

Node-wide failures stay partial: when nvmlDeviceGetCount fails, the last known device list is
read as usual (``ok`` is False for the round; only GPUs that cannot be read are marked).

Cost: identity (name, serial, VBIOS, PCI, compute capability, MIG layout, which NVLinks
exist, whether ECC is on) is read once per device and cached; a device is re-read from
scratch after it was lost, needed a reset or could not be identified (a single failing
reading leaves the cache alone: it says nothing about who the device is).

Failures stay local: an error on one function of one GPU leaves that value out (and counts
it), NVML_ERROR_GPU_IS_LOST or RESET_REQUIRED stops reading that GPU for this round and flags
it, and the other GPUs are read as usual.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from gpuquota.exporter.collect.nvml import (
    FI_CLOCK_EVENT_TIME,
    FI_ENERGY,
    FI_GPU_RECOVERY_ACTION,
    FI_MEMORY_TEMP,
    FI_NVLINK_TOTALS,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    GPU_IS_LOST,
    NVLINK_MAX_LINKS,
    RESET_REQUIRED,
    Handle,
    NvmlApi,
    NvmlError,
)
from gpuquota.exporter.collect.profiling import ProfilingReader
from gpuquota.exporter.collect.tiers import TIER_RANK, Tier, tier_of
from gpuquota.exporter.collect.xid import XidWatcher
from gpuquota.exporter.snapshot import (
    DeviceSnapshot,
    DeviceState,
    MigInfo,
    NodeSnapshot,
    NvLinkCounters,
    ProcessUsage,
)

log = logging.getLogger(__name__)

Enricher = Callable[[NodeSnapshot], NodeSnapshot]
Subscriber = Callable[[NodeSnapshot], None]

MIG_RESCAN_COLLECTIONS = 60  # re-enumerate MIG instances this often even without errors
SLOW_INTERVALS = 5  # default slow_interval: this many collection intervals
WORKER_IDLE_S = 120.0  # a GPU worker thread idle this long ends (a new one starts on demand)
STALL_ROUNDS = 3  # a GPU whose read is this many read timeouts late is published as ERROR


@functools.cache
def _tier(*fields: str) -> Tier:
    """The tier exporter/collect/tiers.py gives these snapshot fields (the fastest of them)."""
    return tier_of(fields)


# Scalar field values: snapshot field, field id, scale. Read in one batched call per round
# with whichever of them are due.
_SCALAR_FIELDS: tuple[tuple[str, int, float], ...] = (
    ("memory_temperature_celsius", FI_MEMORY_TEMP, 1.0),
    ("recovery_action", FI_GPU_RECOVERY_ACTION, 1.0),
    ("energy_joules", FI_ENERGY, 1e-3),
    ("pcie_tx_bytes", FI_PCIE_TX_BYTES, 1.0),
    ("pcie_rx_bytes", FI_PCIE_RX_BYTES, 1.0),
)
_PCIE_COUNTERS = (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES)
_NVLINK_COUNTERS = (
    ("replay_errors", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery_errors", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
    ("crc_flit_errors", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data_errors", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
)


class _DeviceDownError(Exception):
    def __init__(self, state: DeviceState) -> None:
        self.state = state


class _Reads:
    """Runs one device's NVML reads, collecting failures instead of raising them.

    ``value`` additionally remembers which readings the device does not support (NVML
    answered NOT_SUPPORTED): a capability does not change while the driver runs, so those
    calls are skipped until the device's cache is reset.
    """

    def __init__(self, unsupported: set[tuple[int, str, tuple[Any, ...]]] | None = None) -> None:
        self.errors: list[tuple[str, str]] = []
        self.unsupported = unsupported if unsupported is not None else set()

    def value(self, read: Callable[..., Any], handle: Handle, *args: Any) -> Any:
        key = (id(handle), read.__name__, args)  # handles are cached: one object per device
        if key in self.unsupported:
            return None
        failures = len(self.errors)
        result = self(read, handle, *args)
        if result is None and len(self.errors) == failures:
            self.unsupported.add(key)
        return result

    def __call__(self, read: Callable[..., Any], *args: Any) -> Any:
        try:
            return read(*args)
        except NvmlError as exc:
            self.errors.append((exc.function, exc.message))
            if exc.code == GPU_IS_LOST:
                raise _DeviceDownError(DeviceState.LOST) from None
            if exc.code == RESET_REQUIRED:
                raise _DeviceDownError(DeviceState.RESET_REQUIRED) from None
            return None


@dataclass(slots=True)
class _MigCache:
    handle: Handle
    identity: dict[str, Any]


@dataclass(slots=True)
class _GpuCache:
    """What is worth remembering about one physical GPU between collections. Only its own
    worker thread writes it; a round reads ``devices`` (replaced whole) and ``last_identity``."""

    handle: Handle | None = None
    identity: dict[str, Any] | None = None  # DeviceSnapshot identity fields
    nvlinks: tuple[int, ...] | None = None  # links that exist on this board
    ecc: bool | None = None  # ECC mode; None: not supported (no ECC counters then)
    migs: list[_MigCache] | None = None
    mig_scanned_at: int = 0
    unsupported: set[tuple[int, str, tuple[Any, ...]]] = field(default_factory=set)
    nvlink_totals: tuple[float | None, ...] = ()  # the totals nvlink_counters were read at
    nvlink_counters: tuple[NvLinkCounters, ...] = ()
    nvlink_read_at: int = 0
    last_identity: dict[str, Any] = field(default_factory=dict)  # survives a loss
    values: dict[str, Any] = field(default_factory=dict)  # latest reading of every field
    read_at: dict[Tier, float] = field(default_factory=dict)  # unix time per complete tier
    pcie_at: tuple[float, float | None, float | None] | None = None  # (monotonic, tx, rx)
    mig_processes: dict[str, tuple[ProcessUsage, ...]] = field(default_factory=dict)
    devices: list[DeviceSnapshot] | None = None  # the last complete reading


class _GpuWorker:
    """One GPU's reader thread: takes one job at a time; a round waits for it until its
    deadline and otherwise goes on without it (the job finishes whenever NVML answers)."""

    def __init__(self, name: str, work: Callable[[frozenset[Tier]], None]) -> None:
        self._name = name
        self._work = work
        self._cv = threading.Condition()
        self._job: frozenset[Tier] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self.started_at = 0.0  # time.monotonic() of the current (or last) job

    def busy_for(self) -> float:
        """Seconds the current job has been running; 0 when idle."""
        with self._cv:
            return time.monotonic() - self.started_at if self._busy else 0.0

    def submit(self, tiers: frozenset[Tier]) -> bool:
        """Starts reading `tiers`; False while the previous job has not finished."""
        with self._cv:
            if self._busy:
                return False
            self._busy = True
            self._job = tiers
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
        self._enrichers: list[Enricher] = []
        self._subscribers: list[Subscriber] = []
        self._latest: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus: list[_GpuCache] = []
        self._workers: list[_GpuWorker] = []
        self._errors_lock = threading.Lock()
        self._errors_total: dict[str, int] = {}
        self._collections = 0
        self._last_success: float | None = None
        self._driver: tuple[str | None, str | None, int | None] | None = None
        self.profiling = ProfilingReader(api)  # GPM and per-process utilisation

    # --- wiring ------------------------------------------------------------------------------
    def add_enricher(self, fn: Enricher) -> None:
        """``fn(snapshot) -> snapshot`` runs after every collection (e.g. adds ``pods``)."""
        self._enrichers.append(fn)

    def subscribe(self, callback: Subscriber) -> None:
        """``callback(snapshot)`` runs in the collect thread after every collection."""
        self._subscribers.append(callback)

    def latest(self) -> NodeSnapshot | None:
        return self._latest

    # --- the loop ----------------------------------------------------------------------------
    def start(self) -> None:
        """Collect once (so ``latest()`` is set), then keep collecting in the background."""
        self.collect_once()
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
        """Read NVML now (every tier), enrich, publish and return the snapshot."""
        return self._collect_and_publish(full=True)

    def _collect_and_publish(self, *, full: bool) -> NodeSnapshot:
        with self._lock:
            snapshot = self._collect(full)
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
    def _collect(self, full: bool) -> NodeSnapshot:
        started = time.perf_counter()
        self._collections += 1
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
            self._count_error(exc.function)
            log.warning("NVML node-wide call failed this round: %s", exc)
            ok = False
            count = len(self._gpus)
        while len(self._gpus) < count:
            index = len(self._gpus)
            self._gpus.append(_GpuCache())
            self._workers.append(
                _GpuWorker(f"nvml-gpu-{index}", functools.partial(self._read_gpu, index))
            )
        now = time.time()
        submitted = []
        for index in range(count):
            tiers = self._due(self._gpus[index], now, full)
            if self._workers[index].submit(tiers):
                submitted.append(self._workers[index])
        deadline = time.monotonic() + self.read_timeout
        for worker in submitted:
            worker.wait(deadline)
        devices: list[DeviceSnapshot] = []
        stall_after = STALL_ROUNDS * max(self.interval, self.read_timeout)
        for index in range(count):
            stuck = self._workers[index].busy_for()
            if stuck > stall_after:
                # NVML has not answered for this GPU for several rounds: it is not read, so
                # say so (health marks it); the other GPUs are published as read
                why = (("collector", f"NVML has not answered for {stuck:.0f} s"),)
                devices.append(self._unreadable(index, DeviceState.ERROR, why))
                continue
            got = self._gpus[index].devices
            devices.extend(
                got if got is not None else [self._unreadable(index, DeviceState.ERROR, ())]
            )
        now = time.time()
        if ok:
            self._last_success = now
        xid_counts = self.xid.counts() if self.xid is not None else {}
        xid_last = self.xid.last() if self.xid is not None else {}
        driver, nvml_version, cuda = self._driver or (None, None, None)
        with self._errors_lock:
            errors_total = dict(self._errors_total)
        return NodeSnapshot(
            hostname=self.hostname,
            driver_version=driver,
            nvml_version=nvml_version,
            cuda_driver_version=cuda,
            devices=tuple(devices),
            collected_at=now,
            collection_seconds=time.perf_counter() - started,
            xid_counts=xid_counts,
            xid_last=xid_last,
            ok=ok,
            nvml_errors_total=errors_total,
            last_success_at=self._last_success,
            collections_total=self._collections,
            nvml_calls=self.api.call_stats(),
        )

    def _due(self, cache: _GpuCache, now: float, full: bool) -> frozenset[Tier]:
        slow_at = cache.read_at.get(Tier.SLOW)
        # half an interval of slack: a slow read due "just after" this round happens now
        if full or slow_at is None or now - slow_at >= self.slow_interval - self.interval / 2:
            return frozenset((Tier.FAST, Tier.SLOW))
        return frozenset((Tier.FAST,))

    def _count_error(self, function: str) -> None:
        with self._errors_lock:
            self._errors_total[function] = self._errors_total.get(function, 0) + 1

    def _unreadable(
        self, index: int, state: DeviceState, errors: tuple[tuple[str, str], ...]
    ) -> DeviceSnapshot:
        cache = self._gpus[index]
        known = dict(cache.last_identity)
        uuid = known.pop("uuid", "")
        return DeviceSnapshot(index=index, uuid=uuid, state=state, errors=errors, **known)

    def _read_gpu(self, index: int, tiers: frozenset[Tier]) -> None:
        """Reads one GPU (in its worker thread) and stores the result in its cache."""
        cache = self._gpus[index]
        if self._collections - cache.mig_scanned_at >= MIG_RESCAN_COLLECTIONS:
            cache.unsupported.clear()  # re-probe now and then (firmware/driver changes)
        reads = _Reads(cache.unsupported)
        api = self.api
        try:
            if cache.handle is None:
                cache.handle = reads(api.handle, index)
                if cache.handle is None:
                    raise _DeviceDownError(DeviceState.ERROR)
            handle = cache.handle
            if cache.identity is None:
                cache.identity = self._read_identity(handle, reads)
                if not cache.identity.get("uuid"):
                    raise _DeviceDownError(DeviceState.ERROR)
                cache.last_identity = dict(cache.identity)
                cache.ecc = reads(api.ecc_mode, handle)
                cache.nvlinks = self._probe_nvlinks(handle, reads)
                cache.migs = None
                cache.values = {}
                cache.pcie_at = None
                cache.read_at[Tier.ONCE] = time.time()
                tiers = tiers | {Tier.SLOW}  # a new identity: nothing known yet
            values = self._read_values(handle, cache, reads, tiers)
            migs = self._read_migs(index, handle, cache, reads, tiers)
            gis = [m.mig.gpu_instance_id for m in migs if m.mig is not None]
            # this GPU's profiling state: only this worker thread touches it
            profiling = self.profiling.read(
                index,
                handle,
                gis,
                reads,
                gpm=_tier("gpm") in tiers,
                processes=_tier("process_utilization") in tiers,
            )
        except _DeviceDownError as down:
            for function, _message in reads.errors:
                self._count_error(function)
            self._forget(cache, handle_too=True)
            self.profiling.forget(index)  # no GPM pair spans the time it was gone
            cache.devices = [self._unreadable(index, down.state, tuple(reads.errors))]
            return
        for function, _message in reads.errors:
            self._count_error(function)
        done = time.time()
        for tier in tiers:
            cache.read_at[tier] = done
        cache.values.update(values)
        identity = dict(cache.identity)
        uuid = identity.pop("uuid")
        gpu = DeviceSnapshot(
            index=index,
            uuid=uuid,
            ecc_mode_enabled=cache.ecc,
            errors=tuple(reads.errors),
            read_at=tuple(
                (t.value, at)
                for t, at in sorted(cache.read_at.items(), key=lambda i: TIER_RANK[i[0]])
            ),
            **identity,
            **cache.values,
            **profiling.gpu,
        )
        migs = [replace(m, **extra) for m, extra in zip(migs, profiling.migs, strict=True)]
        cache.devices = [gpu, *migs]

    @staticmethod
    def _forget(cache: _GpuCache, *, handle_too: bool) -> None:
        cache.identity = None
        cache.migs = None
        cache.unsupported.clear()
        cache.nvlink_totals = ()
        cache.values = {}
        cache.read_at.clear()
        cache.pcie_at = None
        if handle_too:
            cache.handle = None

    def _read_identity(self, handle: Handle, reads: _Reads) -> dict[str, Any]:
        api = self.api
        return {
            "uuid": reads(api.uuid, handle),
            "name": reads(api.name, handle),
            "pci_bus_id": reads(api.pci_bus_id, handle),
            "minor_number": reads(api.minor_number, handle),
            "serial": reads(api.serial, handle),
            "vbios_version": reads(api.vbios_version, handle),
            "compute_capability": reads(api.compute_capability, handle),
            "mig_mode_enabled": reads(api.mig_mode, handle),
        }

    def _probe_nvlinks(self, handle: Handle, reads: _Reads) -> tuple[int, ...]:
        links: list[int] = []
        for link in range(NVLINK_MAX_LINKS):
            active = reads(self.api.nvlink_active, handle, link)
            if active is None:
                break
            links.append(link)
        return tuple(links)

    def _read_values(
        self, handle: Handle, cache: _GpuCache, reads: _Reads, tiers: frozenset[Tier]
    ) -> dict[str, Any]:
        """The fields due in `tiers` (the metric table says which tier each field is in)."""
        api = self.api

        def due(*fields: str) -> bool:
            return _tier(*fields) in tiers

        v: dict[str, Any] = {}
        if due("gpu_utilization_ratio", "memory_utilization_ratio"):
            util = reads.value(api.utilization, handle)
            v["gpu_utilization_ratio"] = None if util is None else util[0] / 100.0
            v["memory_utilization_ratio"] = None if util is None else util[1] / 100.0
        if due("encoder_utilization_ratio"):
            v["encoder_utilization_ratio"] = _scale(
                reads.value(api.encoder_utilization, handle), 0.01
            )
        if due("decoder_utilization_ratio"):
            v["decoder_utilization_ratio"] = _scale(
                reads.value(api.decoder_utilization, handle), 0.01
            )
        if due("memory_used_bytes"):
            v.update(_memory_fields(reads.value(api.memory, handle)))
        if due("gpu_temperature_celsius"):
            v["gpu_temperature_celsius"] = _scale(reads.value(api.temperature, handle), 1.0)
        v.update(self._read_fields(handle, cache, reads, tiers))
        if due("power_watts"):
            v["power_watts"] = _scale(reads.value(api.power_usage_mw, handle), 1e-3)
        if due("power_limit_watts"):
            v["power_limit_watts"] = _scale(reads.value(api.power_limit_mw, handle), 1e-3)
        if due("sm_clock_hertz"):
            v["sm_clock_hertz"] = _scale(
                reads.value(api.clock_mhz, handle, pynvml.NVML_CLOCK_SM), 1e6
            )
        if due("memory_clock_hertz"):
            v["memory_clock_hertz"] = _scale(
                reads.value(api.clock_mhz, handle, pynvml.NVML_CLOCK_MEM), 1e6
            )
        if due("pcie_replay_total"):
            v["pcie_replay_total"] = reads.value(api.pcie_replay_counter, handle)
        if due("fan_speed_ratio"):
            v["fan_speed_ratio"] = _scale(reads.value(api.fan_speed_percent, handle), 0.01)
        if due("performance_state"):
            v["performance_state"] = reads.value(api.performance_state, handle)
        if due("clock_event_reasons"):
            v["clock_event_reasons"] = reads.value(api.clock_event_reasons, handle)
        if cache.ecc and due("ecc_corrected_volatile"):
            corrected, uncorrected = (
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            )
            volatile, aggregate = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
            v["ecc_corrected_volatile"] = reads.value(api.ecc_errors, handle, corrected, volatile)
            v["ecc_uncorrected_volatile"] = reads.value(
                api.ecc_errors, handle, uncorrected, volatile
            )
            v["ecc_corrected_aggregate"] = reads.value(api.ecc_errors, handle, corrected, aggregate)
            v["ecc_uncorrected_aggregate"] = reads.value(
                api.ecc_errors, handle, uncorrected, aggregate
            )
        if due("remapped_rows_correctable"):
            remap = reads.value(api.remapped_rows, handle) or (None, None, None, None)
            (
                v["remapped_rows_correctable"],
                v["remapped_rows_uncorrectable"],
                v["remap_pending"],
                v["remap_failure"],
            ) = remap
        if due("retired_pages_single_bit"):
            v["retired_pages_single_bit"] = reads.value(
                api.retired_pages,
                handle,
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            )
            v["retired_pages_double_bit"] = reads.value(
                api.retired_pages, handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            )
        if due("retired_pages_pending"):
            v["retired_pages_pending"] = reads.value(api.retired_pages_pending, handle)
        if due("processes"):
            v["processes"] = self._read_processes(handle, reads)
        return v

    def _read_fields(
        self, handle: Handle, cache: _GpuCache, reads: _Reads, tiers: frozenset[Tier]
    ) -> dict[str, Any]:
        """Every field value due this round in one nvmlDeviceGetFieldValues call: HBM
        temperature, recovery action, energy, PCIe byte counters, the NVLink error totals
        and the clock-event-reason time counters."""
        scalars = [
            (name, fid, scale) for name, fid, scale in _SCALAR_FIELDS if _tier(name) in tiers
        ]
        nvlinks = bool(cache.nvlinks) and _tier("nvlinks") in tiers
        clock_times = _tier("clock_event_time_ns") in tiers
        ids = [fid for _, fid, _ in scalars]
        ids += list(FI_NVLINK_TOTALS) if nvlinks else []
        ids += [fid for _, fid in FI_CLOCK_EVENT_TIME] if clock_times else []
        if not ids:
            return {}
        got = reads.value(self.api.field_values, handle, tuple(ids)) or [None] * len(ids)
        read_at = time.monotonic()  # when the counters were read (fields each take their time)
        by_id = dict(zip(ids, got, strict=True))
        v: dict[str, Any] = {}
        for name, fid, scale in scalars:
            raw = by_id[fid]
            v[name] = None if raw is None else (int(raw) if scale == 1.0 else raw * scale)
        if "pcie_tx_bytes" in v:
            v.update(
                self._pcie_rates(cache, reads, read_at, v["pcie_tx_bytes"], v["pcie_rx_bytes"])
            )
        if nvlinks:
            totals = tuple(by_id[fid] for fid in FI_NVLINK_TOTALS)
            v["nvlinks"] = self._read_nvlinks(handle, cache, totals, reads)
        elif _tier("nvlinks") in tiers:
            v["nvlinks"] = ()
        if clock_times:
            v["clock_event_time_ns"] = tuple(
                (reason, float(by_id[fid])) for reason, fid in FI_CLOCK_EVENT_TIME
                if by_id[fid] is not None
            )  # fmt: skip
        return v

    def _pcie_rates(
        self, cache: _GpuCache, reads: _Reads, at: float, tx: int | None, rx: int | None
    ) -> dict[str, float | None]:
        """Bytes/s from the byte counters: since the previous reading, or, for a GPU read
        for the first time, over a second reading right after (a short but real window)."""
        previous = cache.pcie_at
        if previous is None and tx is not None and cache.handle is not None:
            time.sleep(0.001)  # a window of at least a millisecond
            again = reads(self.api.field_values, cache.handle, _PCIE_COUNTERS) or (None, None)
            previous, (tx, rx) = (at, tx, rx), (_int(again[0]), _int(again[1]))
            at = time.monotonic()
        cache.pcie_at = (at, tx, rx)
        if previous is None or at <= previous[0]:
            return {"pcie_tx_bytes_per_second": None, "pcie_rx_bytes_per_second": None}
        span = at - previous[0]
        out: dict[str, float | None] = {}
        for key, now_value, then_value in (
            ("pcie_tx_bytes_per_second", tx, previous[1]),
            ("pcie_rx_bytes_per_second", rx, previous[2]),
        ):
            # a counter that went back wrapped (NVML says it may) or was reset: no rate now
            ok = now_value is not None and then_value is not None and now_value >= then_value
            out[key] = (now_value - then_value) / span if ok else None  # type: ignore[operator]
        return out

    def _read_nvlinks(
        self,
        handle: Handle,
        cache: _GpuCache,
        totals: tuple[float | None, ...],
        reads: _Reads,
    ) -> tuple[NvLinkCounters, ...]:
        """Per-link error counters, re-read only when a per-GPU total moved.

        Reading 4 counters on each of 18 links is most of an H100's NVML calls; the totals
        come in the batched field read, so the per-link reads happen only when an error
        counter actually changed (or the totals are unavailable, or now and then).
        """
        if not cache.nvlinks:
            return ()
        fresh = self._collections - cache.nvlink_read_at < MIG_RESCAN_COLLECTIONS
        if None not in totals and totals == cache.nvlink_totals and fresh:
            return cache.nvlink_counters
        failures = len(reads.errors)
        counters = tuple(self._read_nvlink(handle, link, reads) for link in cache.nvlinks)
        if len(reads.errors) == failures:
            cache.nvlink_totals = totals
            cache.nvlink_counters = counters
            cache.nvlink_read_at = self._collections
        return counters

    def _read_nvlink(self, handle: Handle, link: int, reads: _Reads) -> NvLinkCounters:
        counts = {
            name: reads.value(self.api.nvlink_error, handle, link, counter)
            for name, counter in _NVLINK_COUNTERS
        }
        return NvLinkCounters(link=link, **counts)

    def _read_processes(self, handle: Handle, reads: _Reads) -> tuple[ProcessUsage, ...]:
        found: list[ProcessUsage] = []
        for kind in ("compute", "graphics"):
            for pid, used in reads.value(self.api.processes, handle, kind) or ():
                found.append(ProcessUsage(pid=pid, used_memory_bytes=used, kind=kind))
        return tuple(found)

    def _read_migs(
        self,
        index: int,
        handle: Handle,
        cache: _GpuCache,
        reads: _Reads,
        tiers: frozenset[Tier],
    ) -> list[DeviceSnapshot]:
        assert cache.identity is not None
        if not cache.identity.get("mig_mode_enabled"):
            return []
        parent_uuid = cache.identity["uuid"]
        if cache.migs is None or self._collections - cache.mig_scanned_at >= MIG_RESCAN_COLLECTIONS:
            cache.migs = self._scan_migs(handle, reads)
            cache.mig_scanned_at = self._collections
        snapshots = []
        processes_due = _tier("processes") in tiers
        for slot, mig in enumerate(cache.migs):
            values = _memory_fields(reads.value(self.api.memory, mig.handle))
            uuid = mig.identity["uuid"]
            if processes_due or uuid not in cache.mig_processes:
                cache.mig_processes[uuid] = self._read_processes(mig.handle, reads)
            snapshots.append(
                DeviceSnapshot(
                    index=slot,
                    uuid=mig.identity["uuid"],
                    mig=MigInfo(
                        parent_uuid=parent_uuid,
                        parent_index=index,
                        gpu_instance_id=mig.identity["gi"],
                        compute_instance_id=mig.identity["ci"],
                        profile=mig.identity["profile"],
                    ),
                    processes=cache.mig_processes[uuid],
                    **values,
                )
            )
        return snapshots

    def _scan_migs(self, handle: Handle, reads: _Reads) -> list[_MigCache]:
        api = self.api
        found: list[_MigCache] = []
        for slot in range(reads(api.max_mig_devices, handle) or 0):
            mig = reads(api.mig_handle, handle, slot)
            if mig is None:
                continue
            uuid = reads(api.uuid, mig)
            if not uuid:
                continue
            identity = {
                "uuid": uuid,
                "gi": reads(api.gpu_instance_id, mig) or 0,
                "ci": reads(api.compute_instance_id, mig) or 0,
                "profile": reads(api.mig_profile, mig) or "",
            }
            found.append(_MigCache(handle=mig, identity=identity))
        return found


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _memory_fields(info: Any) -> dict[str, Any]:
    if info is None:
        return {}
    return {
        "memory_total_bytes": info.total,
        "memory_used_bytes": info.used,
        "memory_free_bytes": info.free,
        "memory_reserved_bytes": info.reserved,
    }
