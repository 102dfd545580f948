"""The only module that calls NVML (through nvidia-ml-py's pynvml) or names its constants.

Every call goes through ``NvmlApi._call``, which turns pynvml's exceptions into one shape:
NOT_SUPPORTED (and FUNCTION_NOT_FOUND: a driver too old for the function) becomes ``None``,
any other failure raises ``NvmlError(function, code, message)``. Values come back in NVML's
own units; converting them to base units is the collector's job.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

Handle = Any  # pynvml's c_nvmlDevice_t (an opaque pointer)
EventSet = Any
GpmSample = Any  # pynvml's c_nvmlGpmSample_t

SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

_UNSUPPORTED = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
NVLINK_MAX_LINKS = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))
XID_EVENT = pynvml.nvmlEventTypeXidCriticalError
FI_MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
# What the driver says the GPU needs (nvmlDeviceGpuRecoveryAction_t); nvml.h 12.8+, not in pynvml.
FI_GPU_RECOVERY_ACTION = 230
# Per-GPU totals over all links, in NvLinkCounters field order (replay, recovery, flit, data).
FI_NVLINK_TOTALS = (
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
)
# Cumulative counters: PCIe bytes (they replace nvmlDeviceGetPcieThroughput's 20 ms sample),
# energy in mJ, and nanoseconds clocks were held down per reason (label -> field id).
FI_PCIE_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
FI_PCIE_RX_BYTES = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
FI_ENERGY = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
FI_CLOCK_EVENT_TIME: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", 74),  # NVML_FI_DEV_PERF_POLICY_POWER (= CLOCKS_EVENT_REASON_SW_POWER_CAP)
    ("thermal", 75),  # NVML_FI_DEV_PERF_POLICY_THERMAL
    ("sync_boost", 76),  # NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
    ("board_limit", 77),  # NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT
    ("gpu_idle", 78),  # NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION
    ("reliability", 79),  # NVML_FI_DEV_PERF_POLICY_RELIABILITY
    ("sw_thermal_slowdown", 269),  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    ("hw_thermal_slowdown", 270),  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    ("hw_power_brake_slowdown", 271),  # ..._HW_POWER_BRAKE_SLOWDOWN
)
# Arguments of the per-device calls, so no other module needs pynvml's names.
CLOCK_SM = pynvml.NVML_CLOCK_SM
CLOCK_MEM = pynvml.NVML_CLOCK_MEM
ECC_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
ECC_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
ECC_VOLATILE = pynvml.NVML_VOLATILE_ECC
ECC_AGGREGATE = pynvml.NVML_AGGREGATE_ECC
RETIRED_SINGLE_BIT = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
RETIRED_DOUBLE_BIT = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
# Per-link NVLink error counters, in NvLinkCounters field order (snapshot field -> counter).
NVLINK_ERROR_COUNTERS: tuple[tuple[str, int], ...] = (
    ("replay_errors", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery_errors", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
    ("crc_flit_errors", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data_errors", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
)
# GPM metric ids (nvmlGpmMetricId_t) the profiling reader asks for.
GPM_GRAPHICS_UTIL = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
GPM_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
GPM_SM_OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
GPM_DRAM_BW_UTIL = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
GPM_ANY_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
GPM_HMMA_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL
GPM_IMMA_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL
GPM_DFMA_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL
GPM_DMMA_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL
GPM_FP64_UTIL = pynvml.NVML_GPM_METRIC_FP64_UTIL
GPM_FP32_UTIL = pynvml.NVML_GPM_METRIC_FP32_UTIL
GPM_FP16_UTIL = pynvml.NVML_GPM_METRIC_FP16_UTIL
GPM_INTEGER_UTIL = pynvml.NVML_GPM_METRIC_INTEGER_UTIL
GPM_PCIE_TX_PER_SEC = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
GPM_PCIE_RX_PER_SEC = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
GPM_NVLINK_TOTAL_TX_PER_SEC = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
GPM_NVLINK_TOTAL_RX_PER_SEC = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
_NO_INSTANCE = 0xFFFFFFFF  # eventData gpuInstanceId/computeInstanceId when not MIG


class NvmlError(Exception):
    """An NVML call failed with something other than NOT_SUPPORTED."""

    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function}: {message} (NVML code {code})")
        self.function = function
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    total: int
    used: int
    free: int
    reserved: int | None


@dataclass(frozen=True, slots=True)
class RawEvent:
    handle_key: int
    event_type: int
    data: int  # the XID code for XID events
    gpu_instance_id: int | None
    compute_instance_id: int | None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def handle_key(handle: Handle) -> int:
    """A hashable identity for a device handle (handles compare by address)."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class NvmlApi:
    """Thin typed wrapper over pynvml; one instance per process."""

    def __init__(self) -> None:
        self._functions: dict[str, Callable[..., Any]] = {}
        self._stats: dict[str, list[float]] = {}  # function -> [calls, seconds]
        self._stats_lock = threading.Lock()

    def _call(self, function: str, *args: Any) -> Any:
        fn = self._functions.get(function)
        if fn is None:
            fn = self._functions[function] = getattr(pynvml, function)
        started = time.perf_counter()
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code in _UNSUPPORTED:
                return None
            raise NvmlError(function, code, _message(exc)) from None
        finally:
            self._timed(function, time.perf_counter() - started)

    def _timed(self, function: str, seconds: float) -> None:
        with self._stats_lock:
            stats = self._stats.get(function)
            if stats is None:
                self._stats[function] = [1.0, seconds]
            else:
                stats[0] += 1
                stats[1] += seconds

    def call_stats(self) -> dict[str, tuple[int, float]]:
        """NVML function -> (calls, seconds spent in them) since this object was made."""
        with self._stats_lock:
            return {f: (int(s[0]), s[1]) for f, s in self._stats.items()}

    def _int(self, function: str, *args: Any) -> int | None:
        return _optional_int(self._call(function, *args))

    # --- library -----------------------------------------------------------------------------
    def init(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            raise NvmlError("nvmlInit", code, _message(exc)) from None

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str | None:
        value = self._call("nvmlSystemGetDriverVersion")
        return None if value is None else _text(value)

    def nvml_version(self) -> str | None:
        value = self._call("nvmlSystemGetNVMLVersion")
        return None if value is None else _text(value)

    def cuda_driver_version(self) -> int | None:
        value = self._call("nvmlSystemGetCudaDriverVersion")
        return None if value is None else int(value)

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount") or 0)

    def handle(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # --- identity ----------------------------------------------------------------------------
    def uuid(self, handle: Handle) -> str | None:
        value = self._call("nvmlDeviceGetUUID", handle)
        return None if value is None else _text(value)

    def name(self, handle: Handle) -> str | None:
        value = self._call("nvmlDeviceGetName", handle)
        return None if value is None else _text(value)

    def serial(self, handle: Handle) -> str | None:
        value = self._call("nvmlDeviceGetSerial", handle)
        return None if value is None else _text(value)

    def vbios_version(self, handle: Handle) -> str | None:
        value = self._call("nvmlDeviceGetVbiosVersion", handle)
        return None if value is None else _text(value)

    def pci_bus_id(self, handle: Handle) -> str | None:
        info = self._call("nvmlDeviceGetPciInfo", handle)
        return None if info is None else _text(info.busId)

    def minor_number(self, handle: Handle) -> int | None:
        value = self._call("nvmlDeviceGetMinorNumber", handle)
        return None if value is None else int(value)

    def compute_capability(self, handle: Handle) -> str | None:
        value = self._call("nvmlDeviceGetCudaComputeCapability", handle)
        return None if value is None else f"{value[0]}.{value[1]}"

    def mig_mode(self, handle: Handle) -> bool | None:
        value = self._call("nvmlDeviceGetMigMode", handle)
        return None if value is None else bool(value[0])

    # --- readings ----------------------------------------------------------------------------
    def utilization(self, handle: Handle) -> tuple[int, int] | None:
        """(gpu %, memory controller %)."""
        value = self._call("nvmlDeviceGetUtilizationRates", handle)
        return None if value is None else (int(value.gpu), int(value.memory))

    def encoder_utilization(self, handle: Handle) -> int | None:
        value = self._call("nvmlDeviceGetEncoderUtilization", handle)
        return None if value is None else int(value[0])

    def decoder_utilization(self, handle: Handle) -> int | None:
        value = self._call("nvmlDeviceGetDecoderUtilization", handle)
        return None if value is None else int(value[0])

    def memory(self, handle: Handle) -> MemoryInfo | None:
        try:
            value = self._call_memory_v2(handle)
        except NvmlError as exc:
            if exc.code not in (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,):
                raise
            value = None
        if value is not None:
            return MemoryInfo(
                int(value.total), int(value.used), int(value.free), int(value.reserved)
            )
        v1 = self._call("nvmlDeviceGetMemoryInfo", handle)
        if v1 is None:
            return None
        return MemoryInfo(int(v1.total), int(v1.used), int(v1.free), None)

    def _call_memory_v2(self, handle: Handle) -> Any:
        started = time.perf_counter()
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code in _UNSUPPORTED:
                return None
            raise NvmlError("nvmlDeviceGetMemoryInfo_v2", code, _message(exc)) from None
        finally:
            self._timed("nvmlDeviceGetMemoryInfo_v2", time.perf_counter() - started)

    def temperature(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)

    def field_values(self, handle: Handle, field_ids: tuple[int, ...]) -> list[float | None]:
        """Several readings in one call (nvmlDeviceGetFieldValues), in ``field_ids`` order.

        A field the device does not support reads as None; any other per-field failure
        fails the whole batch with that field's code.
        """
        values = self._call("nvmlDeviceGetFieldValues", handle, list(field_ids))
        if values is None:
            return [None] * len(field_ids)
        out: list[float | None] = []
        for field in values:
            code = int(field.nvmlReturn)
            if code in _UNSUPPORTED:
                out.append(None)
            elif code != SUCCESS:
                raise NvmlError("nvmlDeviceGetFieldValues", code, _error_string(code))
            else:
                out.append(_field_value(field))
        return out

    def power_usage_mw(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetPowerUsage", handle)

    def power_limit_mw(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetEnforcedPowerLimit", handle)

    def energy_mj(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetTotalEnergyConsumption", handle)

    def clock_mhz(self, handle: Handle, clock: int) -> int | None:
        return self._int("nvmlDeviceGetClockInfo", handle, clock)

    def pcie_throughput_kbps(self, handle: Handle, counter: int) -> int | None:
        return self._int("nvmlDeviceGetPcieThroughput", handle, counter)

    def pcie_replay_counter(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetPcieReplayCounter", handle)

    def fan_speed_percent(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetFanSpeed", handle)

    def performance_state(self, handle: Handle) -> int | None:
        value = self._call("nvmlDeviceGetPerformanceState", handle)
        # NVML_PSTATE_UNKNOWN (32) means the driver does not know: leave the series out.
        return None if value is None or int(value) > 15 else int(value)

    def clock_event_reasons(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def ecc_mode(self, handle: Handle) -> bool | None:
        value = self._call("nvmlDeviceGetEccMode", handle)
        return None if value is None else bool(value[0])

    def ecc_errors(self, handle: Handle, error_type: int, counter_type: int) -> int | None:
        return self._int("nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)

    def remapped_rows(self, handle: Handle) -> tuple[int, int, bool, bool] | None:
        value = self._call("nvmlDeviceGetRemappedRows", handle)
        if value is None:
            return None
        corr, unc, pending, failure = value
        return int(corr), int(unc), bool(pending), bool(failure)

    def retired_pages(self, handle: Handle, cause: int) -> int | None:
        value = self._call("nvmlDeviceGetRetiredPages", handle, cause)
        return None if value is None else len(value)

    def retired_pages_pending(self, handle: Handle) -> bool | None:
        value = self._call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return None if value is None else bool(value)

    def nvlink_active(self, handle: Handle, link: int) -> bool | None:
        """None when the device has no NVLink (or not this many links)."""
        try:
            value = self._call("nvmlDeviceGetNvLinkState", handle, link)
        except NvmlError as exc:
            if exc.code in (pynvml.NVML_ERROR_INVALID_ARGUMENT, NOT_FOUND):
                return None
            raise
        return None if value is None else bool(value)

    def nvlink_error(self, handle: Handle, link: int, counter: int) -> int | None:
        return self._int("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)

    # --- topology (the device plugin's GetPreferredAllocation) ---------------------------
    def nvlink_remote_bus_id(self, handle: Handle, link: int) -> str | None:
        """PCI bus ID of the device at the far end of an active NVLink."""
        value = self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        return None if value is None else _text(value.busId)

    def nvlink_remote_is_switch(self, handle: Handle, link: int) -> bool | None:
        """True when the far end is an NVSwitch, False for a GPU, None when unknown."""
        value = self._call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if value is None:
            return None
        return int(value) == int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    def numa_node(self, handle: Handle) -> int | None:
        """The NUMA node the GPU is attached to (None when unknown or not NUMA)."""
        value = self._int("nvmlDeviceGetNumaNodeId", handle)
        return None if value is None or value < 0 else value

    def topology_level(self, first: Handle, second: Handle) -> int | None:
        """NVML_TOPOLOGY_* of the pair's closest common PCIe ancestor (0 close .. 50 far)."""
        return self._int("nvmlDeviceGetTopologyCommonAncestor", first, second)

    def processes(self, handle: Handle, kind: str) -> list[tuple[int, int | None]] | None:
        """(pid, used bytes or None) for compute or graphics processes."""
        function = (
            "nvmlDeviceGetComputeRunningProcesses"
            if kind == "compute"
            else "nvmlDeviceGetGraphicsRunningProcesses"
        )
        value = self._call(function, handle)
        if value is None:
            return None
        return [(int(p.pid), _optional_int(p.usedGpuMemory)) for p in value]

    # --- MIG ---------------------------------------------------------------------------------
    def max_mig_devices(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetMaxMigDeviceCount", handle)

    def mig_handle(self, handle: Handle, slot: int) -> Handle | None:
        """The MIG device in ``slot``, or None when the slot is empty."""
        try:
            return self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        except NvmlError as exc:
            if exc.code in (NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                return None
            raise

    def gpu_instance_id(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetGpuInstanceId", handle)

    def compute_instance_id(self, handle: Handle) -> int | None:
        return self._int("nvmlDeviceGetComputeInstanceId", handle)

    def mig_profile(self, handle: Handle) -> str | None:
        """The profile name as the device plugin names it: "<slices>g.<GiB rounded up>gb"."""
        attrs = self._call("nvmlDeviceGetAttributes", handle)
        if attrs is None:
            return None
        gib = math.ceil(int(attrs.memorySizeMB) / 1024)
        return f"{int(attrs.gpuInstanceSliceCount)}g.{gib}gb"

    # --- events ------------------------------------------------------------------------------
    def event_set_create(self) -> EventSet:
        return self._call("nvmlEventSetCreate")

    def register_events(self, handle: Handle, event_types: int, event_set: EventSet) -> bool:
        """False when the device does not support these events."""
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, event_types, event_set)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code in _UNSUPPORTED:
                return False
            raise NvmlError("nvmlDeviceRegisterEvents", code, _message(exc)) from None
        return True

    def event_wait(self, event_set: EventSet, timeout_ms: int) -> RawEvent | None:
        """The next event, or None after ``timeout_ms`` without one."""
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code == TIMEOUT:
                return None
            # Unlike a reading, "not supported" here must not look like "no event yet".
            raise NvmlError("nvmlEventSetWait_v2", code, _message(exc)) from None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return RawEvent(
            handle_key=handle_key(data.device),
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance_id=None if gi == _NO_INSTANCE else gi,
            compute_instance_id=None if ci == _NO_INSTANCE else ci,
        )

    def event_set_free(self, event_set: EventSet) -> None:
        self._call("nvmlEventSetFree", event_set)

    # --- profiling: GPM and per-process utilisation (read by exporter/collect/profiling.py) ----------
    def gpm_supported(self, handle: Handle) -> bool:
        """Whether the GPU does GPM (Hopper and later); False also where the driver lacks the
        call."""
        support = self._call("nvmlGpmQueryDeviceSupport", handle)
        return support is not None and bool(support.isSupportedDevice)

    def gpm_sample_alloc(self) -> GpmSample:
        return self._call("nvmlGpmSampleAlloc")

    def gpm_sample_free(self, sample: GpmSample) -> None:
        self._call("nvmlGpmSampleFree", sample)

    def gpm_sample(self, handle: Handle, sample: GpmSample, gpu_instance_id: int | None) -> bool:
        """Fills `sample` for the GPU, or for its MIG instance `gpu_instance_id`; False when
        not supported."""
        if gpu_instance_id is None:
            done = self._call("nvmlGpmSampleGet", handle, sample)
        else:
            done = self._call("nvmlGpmMigSampleGet", handle, gpu_instance_id, sample)
        return done is not None

    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metric_ids: tuple[int, ...]
    ) -> dict[int, float | None] | None:
        """NVML_GPM_METRIC_* id -> value between two samples (None where that metric failed)."""
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = first
        request.sample2 = second
        for slot, metric in enumerate(metric_ids):
            request.metrics[slot].metricId = metric
        if self._call("nvmlGpmMetricsGet", request) is None:
            return None
        out: dict[int, float | None] = {}
        for slot, metric in enumerate(metric_ids):
            m = request.metrics[slot]
            ok = int(m.nvmlReturn) == SUCCESS and math.isfinite(m.value)
            out[metric] = float(m.value) if ok else None
        return out

    def process_utilization(
        self, handle: Handle, since_us: int
    ) -> list[tuple[int, int, int, int, int, int]] | None:
        """(pid, timestamp us, SM %, memory %, encoder %, decoder %) of every process with
        utilisation samples newer than `since_us`; [] when there are none."""
        try:
            samples = self._call("nvmlDeviceGetProcessUtilization", handle, since_us)
        except NvmlError as exc:
            if exc.code == NOT_FOUND:  # no process had any utilisation since then
                return []
            raise
        if samples is None:
            return None
        return [
            (int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil), int(s.encUtil),
             int(s.decUtil))
            for s in samples
        ]  # fmt: skip


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _field_value(field: Any) -> float:
    kind = int(field.valueType)
    value = field.value
    by_type = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    }
    return float(getattr(value, by_type.get(kind, "uiVal")))


def _message(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:  # nvmlErrorString itself failed: the library may not be loaded at all
        return f"NVML error {getattr(exc, 'value', '?')}"


def _error_string(code: int) -> str:
    return _message(pynvml.NVMLError(code))
