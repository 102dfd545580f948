"""The collect step: a background loop that reads NVML into one NodeSnapshot per interval.

``Collector.collect_once`` reads every GPU (and its MIG instances) through ``NvmlApi``, runs
the enrichers (pod attribution) on the result, stores it as ``latest()`` and hands it to the
subscribers (the health checker). Scrapes only ever read ``latest()``.

Cost: identity (name, serial, VBIOS, PCI, compute capability, MIG layout, which NVLinks
exist, whether ECC is on) is read once per device and cached; a device is re-read from
scratch after it was lost, needed a reset or could not be identified (a single failing
reading leaves the cache alone: it says nothing about who the device is).

Failures stay local: an error on one function of one GPU leaves that value out (and counts
it), NVML_ERROR_GPU_IS_LOST or RESET_REQUIRED stops reading that GPU for this round and flags
it, and the other GPUs are read as usual.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from exporter.nvml import (
    FI_GPU_RECOVERY_ACTION,
    FI_MEMORY_TEMP,
    FI_NVLINK_TOTALS,
    GPU_IS_LOST,
    NVLINK_MAX_LINKS,
    RESET_REQUIRED,
    Handle,
    NvmlApi,
    NvmlError,
)
from exporter.profiling import ProfilingReader
from exporter.snapshot import (
    DeviceSnapshot,
    DeviceState,
    MigInfo,
    NodeSnapshot,
    NvLinkCounters,
    ProcessUsage,
)
from exporter.xid import XidWatcher

log = logging.getLogger(__name__)

Enricher = Callable[[NodeSnapshot], NodeSnapshot]
Subscriber = Callable[[NodeSnapshot], None]

MIG_RESCAN_COLLECTIONS = 60  # re-enumerate MIG instances this often even without errors
# read together, once per GPU per round
_FIELDS = (FI_MEMORY_TEMP, *FI_NVLINK_TOTALS, FI_GPU_RECOVERY_ACTION)
_NVLINK_FIELDS = slice(1, 1 + len(FI_NVLINK_TOTALS))
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
    """What is worth remembering about one physical GPU between collections."""

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


class Collector:
    """Reads NVML in a background thread; one immutable NodeSnapshot per interval."""

    def __init__(
        self,
        api: NvmlApi,
        *,
        interval: float = 1.0,
        hostname: str | None = None,
        xid: XidWatcher | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.api = api
        self.interval = interval
        self.hostname = hostname or socket.gethostname()
        self.xid = xid
        self._enrichers: list[Enricher] = []
        self._subscribers: list[Subscriber] = []
        self._latest: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus: list[_GpuCache] = []
        self._count: int | None = None
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
                self.collect_once()
            except Exception:  # never let one bad round kill the loop
                log.exception("collection failed")
            # Fixed rate; after a stall skip the missed rounds instead of bursting.
            next_at = max(next_at + self.interval, time.monotonic())

    def collect_once(self) -> NodeSnapshot:
        """Read NVML now, enrich, publish and return the snapshot."""
        with self._lock:
            snapshot = self._collect()
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
    def _collect(self) -> NodeSnapshot:
        started = time.perf_counter()
        self._collections += 1
        ok = True
        devices: list[DeviceSnapshot] = []
        try:
            count = self.api.device_count()
            if self._driver is None:
                self._driver = (
                    self.api.driver_version(),
                    self.api.nvml_version(),
                    self.api.cuda_driver_version(),
                )
        except NvmlError as exc:
            self._count_error(exc.function)
            log.warning("NVML unavailable this round: %s", exc)
            ok = False
            count = len(self._gpus)
        while len(self._gpus) < count:
            self._gpus.append(_GpuCache())
        for index in range(count):
            if ok:
                devices.extend(self._read_gpu(index))
            else:
                devices.append(self._unreadable(index, DeviceState.ERROR, ()))
        now = time.time()
        if ok:
            self._last_success = now
        xid_counts = self.xid.counts() if self.xid is not None else {}
        xid_last = self.xid.last() if self.xid is not None else {}
        driver, nvml_version, cuda = self._driver or (None, None, None)
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
            nvml_errors_total=dict(self._errors_total),
            last_success_at=self._last_success,
            collections_total=self._collections,
        )

    def _count_error(self, function: str) -> None:
        self._errors_total[function] = self._errors_total.get(function, 0) + 1

    def _unreadable(
        self, index: int, state: DeviceState, errors: tuple[tuple[str, str], ...]
    ) -> DeviceSnapshot:
        cache = self._gpus[index]
        known = dict(cache.last_identity)
        uuid = known.pop("uuid", "")
        return DeviceSnapshot(index=index, uuid=uuid, state=state, errors=errors, **known)

    def _read_gpu(self, index: int) -> list[DeviceSnapshot]:
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
            values = self._read_values(handle, cache, reads)
            migs = self._read_migs(index, handle, cache, reads)
            gis = [m.mig.gpu_instance_id for m in migs if m.mig is not None]
            profiling = self.profiling.read(index, handle, gis, reads)
        except _DeviceDownError as down:
            for function, _message in reads.errors:
                self._count_error(function)
            self._forget(cache, handle_too=True)
            return [self._unreadable(index, down.state, tuple(reads.errors))]
        for function, _message in reads.errors:
            self._count_error(function)
        identity = dict(cache.identity)
        uuid = identity.pop("uuid")
        gpu = DeviceSnapshot(
            index=index,
            uuid=uuid,
            ecc_mode_enabled=cache.ecc,
            errors=tuple(reads.errors),
            **identity,
            **values,
            **profiling.gpu,
        )
        migs = [replace(m, **extra) for m, extra in zip(migs, profiling.migs, strict=True)]
        return [gpu, *migs]

    @staticmethod
    def _forget(cache: _GpuCache, *, handle_too: bool) -> None:
        cache.identity = None
        cache.migs = None
        cache.unsupported.clear()
        cache.nvlink_totals = ()
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

    def _read_values(self, handle: Handle, cache: _GpuCache, reads: _Reads) -> dict[str, Any]:
        api = self.api
        v: dict[str, Any] = {}
        util = reads.value(api.utilization, handle)
        if util is not None:
            v["gpu_utilization_ratio"] = util[0] / 100.0
            v["memory_utilization_ratio"] = util[1] / 100.0
        v["encoder_utilization_ratio"] = _scale(reads.value(api.encoder_utilization, handle), 0.01)
        v["decoder_utilization_ratio"] = _scale(reads.value(api.decoder_utilization, handle), 0.01)
        v.update(_memory_fields(reads.value(api.memory, handle)))
        v["gpu_temperature_celsius"] = _scale(reads.value(api.temperature, handle), 1.0)
        # One batched call: HBM temperature and the NVLink error totals over all links.
        fields = reads.value(api.field_values, handle, _FIELDS) or [None] * len(_FIELDS)
        v["memory_temperature_celsius"] = fields[0]
        v["recovery_action"] = None if fields[-1] is None else int(fields[-1])
        v["power_watts"] = _scale(reads.value(api.power_usage_mw, handle), 1e-3)
        v["power_limit_watts"] = _scale(reads.value(api.power_limit_mw, handle), 1e-3)
        v["energy_joules"] = _scale(reads.value(api.energy_mj, handle), 1e-3)
        v["sm_clock_hertz"] = _scale(reads.value(api.clock_mhz, handle, pynvml.NVML_CLOCK_SM), 1e6)
        v["memory_clock_hertz"] = _scale(
            reads.value(api.clock_mhz, handle, pynvml.NVML_CLOCK_MEM), 1e6
        )
        v["pcie_tx_bytes_per_second"] = _scale(
            reads.value(api.pcie_throughput_kbps, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES), 1024.0
        )
        v["pcie_rx_bytes_per_second"] = _scale(
            reads.value(api.pcie_throughput_kbps, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES), 1024.0
        )
        v["pcie_replay_total"] = reads.value(api.pcie_replay_counter, handle)
        v["fan_speed_ratio"] = _scale(reads.value(api.fan_speed_percent, handle), 0.01)
        v["performance_state"] = reads.value(api.performance_state, handle)
        v["clock_event_reasons"] = reads.value(api.clock_event_reasons, handle)
        if cache.ecc:
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
        remap = reads.value(api.remapped_rows, handle)
        if remap is not None:
            (
                v["remapped_rows_correctable"],
                v["remapped_rows_uncorrectable"],
                v["remap_pending"],
                v["remap_failure"],
            ) = remap
        v["retired_pages_single_bit"] = reads.value(
            api.retired_pages,
            handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        v["retired_pages_double_bit"] = reads.value(
            api.retired_pages, handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        v["retired_pages_pending"] = reads.value(api.retired_pages_pending, handle)
        v["nvlinks"] = self._read_nvlinks(handle, cache, tuple(fields[_NVLINK_FIELDS]), reads)
        v["processes"] = self._read_processes(handle, reads)
        return v

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
        self, index: int, handle: Handle, cache: _GpuCache, reads: _Reads
    ) -> list[DeviceSnapshot]:
        assert cache.identity is not None
        if not cache.identity.get("mig_mode_enabled"):
            return []
        parent_uuid = cache.identity["uuid"]
        if cache.migs is None or self._collections - cache.mig_scanned_at >= MIG_RESCAN_COLLECTIONS:
            cache.migs = self._scan_migs(handle, reads)
            cache.mig_scanned_at = self._collections
        snapshots = []
        for slot, mig in enumerate(cache.migs):
            values = _memory_fields(reads.value(self.api.memory, mig.handle))
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
                    processes=self._read_processes(mig.handle, reads),
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
