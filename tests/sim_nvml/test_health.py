"""Memory health, thermals, PCIe, fans, clocks: values round-trip, and NOT_SUPPORTED where
the model lacks the feature."""

from __future__ import annotations

import pynvml
import pytest

NS = pynvml.NVML_ERROR_NOT_SUPPORTED


def _code(fn, *args):
    with pytest.raises(pynvml.NVMLError) as err:
        fn(*args)
    return err.value.value


def test_ecc_counters_by_type_and_scope(nvml):
    node = nvml("h100x8")
    node.set(
        1,
        ecc_corrected_volatile=5,
        ecc_uncorrected_volatile=1,
        ecc_corrected_aggregate=50,
        ecc_uncorrected_aggregate=2,
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
    got = {
        (t, c): pynvml.nvmlDeviceGetTotalEccErrors(h, t, c)
        for t in (
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        )
        for c in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)
    }
    assert got == {(0, 0): 5, (1, 0): 1, (0, 1): 50, (1, 1): 2}
    values = pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL]
    )
    assert [(v.nvmlReturn, v.value.ullVal) for v in values] == [(0, 1), (0, 50)]
    node.set(1, ecc_mode_enabled=False)
    assert pynvml.nvmlDeviceGetEccMode(h) == [0, 0]
    assert _code(pynvml.nvmlDeviceGetTotalEccErrors, h, 1, 0) == NS


def test_l4_has_no_ecc_nvlink_fan_memory_temperature_or_remapping(nvml):
    nvml("l4x2")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert _code(pynvml.nvmlDeviceGetEccMode, h) == NS
    assert _code(pynvml.nvmlDeviceGetTotalEccErrors, h, 1, 1) == NS
    assert _code(pynvml.nvmlDeviceGetRemappedRows, h) == NS
    assert _code(pynvml.nvmlDeviceGetFanSpeed, h) == NS
    assert _code(pynvml.nvmlDeviceGetNvLinkState, h, 0) == NS
    assert _code(pynvml.nvmlDeviceGetMigMode, h) == NS
    (temp,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert temp.nvmlReturn == NS
    events = pynvml.nvmlDeviceGetSupportedEventTypes(h)
    assert events & pynvml.nvmlEventTypeXidCriticalError
    assert not events & pynvml.nvmlEventTypeDoubleBitEccError
    # ...but it does have an encoder, which the H100 lacks
    assert pynvml.nvmlDeviceGetEncoderUtilization(h)[0] == 0


def test_sxm_boards_report_no_fan_and_no_encoder(nvml):
    nvml("h100x8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert _code(pynvml.nvmlDeviceGetFanSpeed, h) == NS
    assert _code(pynvml.nvmlDeviceGetEncoderUtilization, h) == NS


def test_readings_round_trip_in_nvml_units(nvml):
    node = nvml({"model": "L4", "count": 1, "values": {"has_fan": True}})
    node.set(
        0,
        memory_temperature_celsius=55,
        pcie_tx_bytes_per_second=2048 * 1024,
        pcie_rx_bytes_per_second=1024 * 10,
        pcie_replay_total=7,
        encoder_utilization_ratio=0.25,
        decoder_utilization_ratio=0.5,
        fan_speed_ratio=0.42,
        performance_state=2,
        clock_event_reasons=pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 2048
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 10
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 7
    assert pynvml.nvmlDeviceGetEncoderUtilization(h)[0] == 25
    assert pynvml.nvmlDeviceGetDecoderUtilization(h)[0] == 50
    assert pynvml.nvmlDeviceGetFanSpeed(h) == 42
    assert pynvml.nvmlDeviceGetPerformanceState(h) == 2
    thermal = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == thermal
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == thermal
    (replay,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER])
    assert (replay.nvmlReturn, replay.value.ullVal) == (0, 7)


def test_memory_temperature_and_energy_through_field_values(nvml):
    node = nvml("h100x8")
    node.set(4, memory_temperature_celsius=61.0, energy_joules=1000.0, power_watts=0.0)
    h = pynvml.nvmlDeviceGetHandleByIndex(4)
    temp, energy, unknown = pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 100000]
    )
    assert (temp.nvmlReturn, temp.valueType, temp.value.uiVal) == (0, 1, 61)
    assert energy.nvmlReturn == 0 and 1_000_000 <= energy.value.ullVal < 1_001_000
    assert unknown.nvmlReturn == NS
    assert temp.timestamp > 1_600_000_000_000_000  # microseconds since 1970


def test_row_remapping_state(nvml):
    node = nvml("a100-mig")
    node.set(3, remapped_rows_correctable=2, remapped_rows_uncorrectable=1, remap_pending=True)
    h = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (2, 1, 1, 0)
    node.set(3, remap_pending=False, remap_failure=True)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (2, 1, 0, 1)
    # Ampere replaced page retirement by row remapping
    assert _code(pynvml.nvmlDeviceGetRetiredPages, h, 0) == NS


def test_page_retirement_on_volta(nvml):
    node = nvml({"model": "V100-SXM2-32GB", "count": 2})
    node.set(0, retired_pages_single_bit=3, retired_pages_double_bit=1, retired_pages_pending=True)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    sbe = pynvml.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    dbe = pynvml.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    assert len(sbe) == 3 == len(set(sbe)) and len(dbe) == 1 and not set(sbe) & set(dbe)
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
    other = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetRetiredPages(other, 1) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(other) == 0
    assert _code(pynvml.nvmlDeviceGetRemappedRows, h) == NS


def test_processes_per_kind_and_update(nvml):
    node = nvml("l4x2")
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    node.add_process(1, 100, 2**30)
    node.add_process(1, 101, 2**31)
    node.add_process(1, 200, 5 * 2**20, kind="graphics")
    node.add_process(1, 100, 3 * 2**30)  # same pid: updated, not duplicated
    compute = {(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    assert compute == {(100, 3 * 2**30), (101, 2**31)}
    graphics = pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(200, 5 * 2**20)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0)) == []
    node.clear_processes(1)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_board_facts_monitoring_tools_show(nvml):
    node = nvml("mixed")
    h100, _, _, l4 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4))
    node.set(0, gpu_temperature_celsius=66, bar1_used_bytes=64 * 2**20)
    assert pynvml.nvmlDeviceGetTemperatureV(h100, pynvml.NVML_TEMPERATURE_GPU) == 66
    bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(h100)
    assert (bar1.bar1Total, bar1.bar1Used) == (128 * 2**30, 64 * 2**20)
    assert bar1.bar1Free == bar1.bar1Total - bar1.bar1Used
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h100) == [200_000, 700_000]
    assert pynvml.nvmlDeviceGetPersistenceMode(h100) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetComputeMode(h100) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert pynvml.nvmlDeviceGetDisplayActive(h100) == pynvml.NVML_FEATURE_DISABLED
    assert pynvml.nvmlDeviceGetBrand(l4) == pynvml.NVML_BRAND_NVIDIA
    slowdown = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    assert pynvml.nvmlDeviceGetTemperatureThreshold(l4, slowdown) > 80
    mem_max = pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
    assert pynvml.nvmlDeviceGetTemperatureThreshold(h100, mem_max) > 80
    assert _code(pynvml.nvmlDeviceGetTemperatureThreshold, l4, mem_max) == NS  # GDDR6
