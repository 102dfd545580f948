"""Reads one GPU at a time from NVML into DeviceSnapshots, keeping what is worth remembering.

``NvmlReader.read_gpu(index, tiers)`` runs in that GPU's reader thread (exporter/collect/
loop.py hands it the tiers due) and leaves the result in the GPU's cache, where the round
picks it up. Each value is read at its tier (exporter/collect/tiers.py) and converted to base
units by exporter/collect/units.py.

Cost: identity (name, serial, VBIOS, PCI, compute capability, MIG layout, which NVLinks
exist, whether ECC is on) is read once per device and cached; a device is re-read from
scratch after it was lost, needed a reset or could not be identified (a single failing
reading leaves the cache alone: it says nothing about who the device is). Readings a device
does not support are not asked again until the next re-probe; the per-link NVLink counters
are re-read only when the per-GPU totals move. All field values due go in one
nvmlDeviceGetFieldValues call; PCIe bytes/s is the rate between two readings of the
cumulative byte counters.

Failures stay local: an error on one function of one GPU leaves that value out (and counts
it), NVML_ERROR_GPU_IS_LOST or RESET_REQUIRED stops reading that GPU for this round and flags
it, and the other GPUs are read as usual.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuquota.exporter.collect.nvml import (
    CLOCK_MEM,
    CLOCK_SM,
    ECC_AGGREGATE,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    FI_CLOCK_EVENT_TIME,
    FI_ENERGY,
    FI_GPU_RECOVERY_ACTION,
    FI_MEMORY_TEMP,
    FI_NVLINK_TOTALS,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    GPU_IS_LOST,
    NVLINK_ERROR_COUNTERS,
    NVLINK_MAX_LINKS,
    RESET_REQUIRED,
    RETIRED_DOUBLE_BIT,
    RETIRED_SINGLE_BIT,
    Handle,
    NvmlApi,
    NvmlError,
)
from gpuquota.exporter.collect.profiling import ProfilingReader
from gpuquota.exporter.collect.tiers import TIER_RANK, Tier, tier_of
from gpuquota.exporter.collect.units import (
    as_int,
    counter_rates,
    memory_fields,
    percent_pair,
    scale,
)
from gpuquota.exporter.snapshot import (
    DeviceSnapshot,
    DeviceState,
    MigInfo,
    NvLinkCounters,
    ProcessUsage,
)

MIG_RESCAN_COLLECTIONS = 60  # re-enumerate MIG instances this often even without errors
REPROBE_COLLECTIONS = 60  # ask readings a GPU does not support again this often


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
    unsupported_since: int = 0  # the collection the unsupported set was last emptied at
    nvlink_totals: tuple[float | None, ...] = ()  # the totals nvlink_counters were read at
    nvlink_counters: tuple[NvLinkCounters, ...] = ()
    nvlink_read_at: int = 0
    last_identity: dict[str, Any] = field(default_factory=dict)  # survives a loss
    values: dict[str, Any] = field(default_factory=dict)  # latest reading of every field
    read_at: dict[Tier, float] = field(default_factory=dict)  # unix time per complete tier
    pcie_at: tuple[float, float | None, float | None] | None = None  # (monotonic, tx, rx)
    mig_processes: dict[str, tuple[ProcessUsage, ...]] = field(default_factory=dict)
    devices: list[DeviceSnapshot] | None = None  # the last complete reading


class NvmlReader:
    """Per-GPU caches and NVML reads; one reader thread per GPU calls ``read_gpu``."""

    def __init__(self, api: NvmlApi) -> None:
        self.api = api
        self.profiling = ProfilingReader(api)  # GPM and per-process utilisation
        self.round = 0  # the round being read (set by the loop before it hands out work)
        self._gpus: list[_GpuCache] = []
        self._errors_lock = threading.Lock()
        self._errors_total: dict[str, int] = {}

    def ensure(self, count: int) -> None:
        """Caches for GPUs 0 .. count-1 (a GPU that appears gets a fresh one)."""
        while len(self._gpus) < count:
            self._gpus.append(_GpuCache())

    @property
    def known(self) -> int:
        """How many GPUs have a cache (the last known device count)."""
        return len(self._gpus)

    def devices(self, index: int) -> list[DeviceSnapshot] | None:
        """GPU `index`'s last complete reading (the GPU, then its MIG instances)."""
        return self._gpus[index].devices

    def read_at(self, index: int, tier: Tier) -> float | None:
        """Unix time of GPU `index`'s last complete reading of `tier`."""
        return self._gpus[index].read_at.get(tier)

    def errors_total(self) -> dict[str, int]:
        with self._errors_lock:
            return dict(self._errors_total)

    def count_error(self, function: str) -> None:
        with self._errors_lock:
            self._errors_total[function] = self._errors_total.get(function, 0) + 1

    def unreadable(
        self, index: int, state: DeviceState, errors: tuple[tuple[str, str], ...]
    ) -> DeviceSnapshot:
        cache = self._gpus[index]
        known = dict(cache.last_identity)
        uuid = known.pop("uuid", "")
        return DeviceSnapshot(index=index, uuid=uuid, state=state, errors=errors, **known)

    def read_gpu(self, index: int, tiers: frozenset[Tier], processes_turn: bool = True) -> None:
        """Reads one GPU (in its reader thread) and stores the result in its cache.
        `processes_turn`: per-process utilisation may be asked this round (its turn)."""
        cache = self._gpus[index]
        if self.round - cache.unsupported_since >= REPROBE_COLLECTIONS:
            # re-probe now and then (firmware/driver changes); its own counter: the MIG scan's
            # never moves on a GPU without MIG, which made every round re-probe (on an H100
            # SXM a NOT_SUPPORTED nvmlDeviceGetFanSpeed costs 0.36 ms)
            cache.unsupported.clear()
            cache.unsupported_since = self.round
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
                processes=processes_turn and _tier("process_utilization") in tiers,
            )
        except _DeviceDownError as down:
            for function, _message in reads.errors:
                self.count_error(function)
            self._forget(cache, handle_too=True)
            self.profiling.forget(index)  # no GPM pair spans the time it was gone
            cache.devices = [self.unreadable(index, down.state, tuple(reads.errors))]
            return
        for function, _message in reads.errors:
            self.count_error(function)
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
            v["gpu_utilization_ratio"], v["memory_utilization_ratio"] = percent_pair(
                reads.value(api.utilization, handle)
            )
        if due("encoder_utilization_ratio"):
            v["encoder_utilization_ratio"] = scale(
                reads.value(api.encoder_utilization, handle), 0.01
            )
        if due("decoder_utilization_ratio"):
            v["decoder_utilization_ratio"] = scale(
                reads.value(api.decoder_utilization, handle), 0.01
            )
        if due("memory_used_bytes"):
            v.update(memory_fields(reads.value(api.memory, handle)))
        if due("gpu_temperature_celsius"):
            v["gpu_temperature_celsius"] = scale(reads.value(api.temperature, handle), 1.0)
        v.update(self._read_fields(handle, cache, reads, tiers))
        if due("power_watts"):
            v["power_watts"] = scale(reads.value(api.power_usage_mw, handle), 1e-3)
        if due("power_limit_watts"):
            v["power_limit_watts"] = scale(reads.value(api.power_limit_mw, handle), 1e-3)
        if due("sm_clock_hertz"):
            v["sm_clock_hertz"] = scale(reads.value(api.clock_mhz, handle, CLOCK_SM), 1e6)
        if due("memory_clock_hertz"):
            v["memory_clock_hertz"] = scale(reads.value(api.clock_mhz, handle, CLOCK_MEM), 1e6)
        if due("pcie_replay_total"):
            v["pcie_replay_total"] = reads.value(api.pcie_replay_counter, handle)
        if due("fan_speed_ratio"):
            v["fan_speed_ratio"] = scale(reads.value(api.fan_speed_percent, handle), 0.01)
        if due("performance_state"):
            v["performance_state"] = reads.value(api.performance_state, handle)
        if due("clock_event_reasons"):
            v["clock_event_reasons"] = reads.value(api.clock_event_reasons, handle)
        if cache.ecc and due("ecc_corrected_volatile"):
            corrected, uncorrected = ECC_CORRECTED, ECC_UNCORRECTED
            volatile, aggregate = ECC_VOLATILE, ECC_AGGREGATE
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
                RETIRED_SINGLE_BIT,
            )
            v["retired_pages_double_bit"] = reads.value(
                api.retired_pages, handle, RETIRED_DOUBLE_BIT
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
        for name, fid, factor in scalars:
            raw = by_id[fid]
            v[name] = None if raw is None else (int(raw) if factor == 1.0 else raw * factor)
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
            previous, (tx, rx) = (at, tx, rx), (as_int(again[0]), as_int(again[1]))
            at = time.monotonic()
        cache.pcie_at = (at, tx, rx)
        return counter_rates(previous, cache.pcie_at)

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
        fresh = self.round - cache.nvlink_read_at < MIG_RESCAN_COLLECTIONS
        if None not in totals and totals == cache.nvlink_totals and fresh:
            return cache.nvlink_counters
        failures = len(reads.errors)
        counters = tuple(self._read_nvlink(handle, link, reads) for link in cache.nvlinks)
        if len(reads.errors) == failures:
            cache.nvlink_totals = totals
            cache.nvlink_counters = counters
            cache.nvlink_read_at = self.round
        return counters

    def _read_nvlink(self, handle: Handle, link: int, reads: _Reads) -> NvLinkCounters:
        counts = {
            name: reads.value(self.api.nvlink_error, handle, link, counter)
            for name, counter in NVLINK_ERROR_COUNTERS
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
        if cache.migs is None or self.round - cache.mig_scanned_at >= MIG_RESCAN_COLLECTIONS:
            cache.migs = self._scan_migs(handle, reads)
            cache.mig_scanned_at = self.round
        snapshots = []
        processes_due = _tier("processes") in tiers
        for slot, mig in enumerate(cache.migs):
            values = memory_fields(reads.value(self.api.memory, mig.handle))
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
