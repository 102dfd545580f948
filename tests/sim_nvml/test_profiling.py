"""GPM (nvmlGpm*) and per-process utilisation in the stand-in, through the real pynvml."""

from __future__ import annotations

import time

import pynvml
import pytest

from gpuquota.sim.nvml.cli import main as sim_cli

H100_MIG = {"gpus": [{"model": "H100-SXM5-80GB", "count": 1, "mig": ["3g.40gb", "3g.40gb"]}]}
MIB = 1024 * 1024


def _metrics(s1, s2, ids):
    get = pynvml.c_nvmlGpmMetricsGet_t()
    get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(ids)
    get.sample1, get.sample2 = s1, s2
    for i, metric in enumerate(ids):
        get.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(get)
    return {
        get.metrics[i].metricId: (get.metrics[i].nvmlReturn, get.metrics[i].value)
        for i in range(len(ids))
    }


def _pair(take, gap):
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    take(s1)
    time.sleep(gap)
    take(s2)
    return s1, s2


def test_gpm_metrics_average_the_rates_between_two_samples(nvml):
    node = nvml("h100x8")
    node.set_gpm(0, sm_activity=0.9588, tensor_activity=0.93, pcie_rx_bytes_per_second=16 * MIB)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = _pair(lambda s: pynvml.nvmlGpmSampleGet(h, s), 0.15)
    got = _metrics(s1, s2, [pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, pynvml.NVML_GPM_METRIC_FP64_UTIL,
                            pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC])  # fmt: skip
    assert got[pynvml.NVML_GPM_METRIC_SM_UTIL] == (0, pytest.approx(95.88, abs=0.01))
    assert got[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL] == (0, pytest.approx(93.0, abs=0.01))
    assert got[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC] == (0, pytest.approx(16.0, abs=0.01))
    assert got[pynvml.NVML_GPM_METRIC_FP64_UTIL] == (0, 0.0)
    assert got[pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC][0] == pynvml.NVML_ERROR_NOT_SUPPORTED
    # A change half-way shows as the time-weighted mean, as real counters do.
    s3 = pynvml.nvmlGpmSampleAlloc()
    a1 = time.time()
    pynvml.nvmlGpmSampleGet(h, s1)
    b1 = time.time()
    time.sleep(0.2)
    c0 = time.time()
    node.set_gpm(0, sm_activity=0.0)
    c1 = time.time()
    time.sleep(0.2)
    a3 = time.time()
    pynvml.nvmlGpmSampleGet(h, s3)
    b3 = time.time()
    sm = _metrics(s1, s3, [pynvml.NVML_GPM_METRIC_SM_UTIL])[pynvml.NVML_GPM_METRIC_SM_UTIL][1]
    busy_least, busy_most = (c0 - b1) / (b3 - a1), (c1 - a1) / (a3 - b1)
    assert 95.88 * busy_least - 1e-6 <= sm <= 95.88 * busy_most + 1e-6
    assert 0 < sm < 95.88
    for s in (s1, s2, s3):
        pynvml.nvmlGpmSampleFree(s)


def test_samples_under_100ms_apart_read_silent_zeros(nvml):
    node = nvml("h100x8")
    node.set_gpm(0, sm_activity=0.96)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = _pair(lambda s: pynvml.nvmlGpmSampleGet(h, s), 0.0)  # microseconds apart
    assert _metrics(s1, s2, [pynvml.NVML_GPM_METRIC_SM_UTIL]) == {
        pynvml.NVML_GPM_METRIC_SM_UTIL: (pynvml.NVML_SUCCESS, 0.0)
    }


def test_gpm_per_mig_instance_by_gpu_instance_id(nvml):
    node = nvml(H100_MIG)
    node.set_gpm(0, mig=1, sm_occupancy=0.25)
    node.set_gpm(0, sm_occupancy=0.1)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gi = pynvml.nvmlDeviceGetGpuInstanceId(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1))
    s1, s2 = _pair(lambda s: pynvml.nvmlGpmMigSampleGet(h, gi, s), 0.12)
    occ = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    assert _metrics(s1, s2, [occ])[occ] == (0, pytest.approx(25.0, abs=0.01))
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpmMigSampleGet(h, 99, s1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # samples of two units
        pynvml.nvmlGpmSampleGet(h, s2)
        _metrics(s1, s2, [occ])


@pytest.mark.parametrize("preset", ["a100-mig", "l4x2"])
def test_gpm_is_not_supported_before_hopper(nvml, preset):
    nvml(preset)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    s = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmSampleGet(h, s)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpmMigSampleGet(h, 1, s)
    pynvml.nvmlGpmSampleFree(s)


def test_process_utilization_both_calls(nvml):
    node = nvml("h100x8")
    node.add_process(0, 411, 8 * 2**30)
    node.set_process_utilization(0, 411, sm=0.92, memory=0.28)
    node.set_process_utilization(0, 412, sm=0.0, memory=0.0)  # idle: no sample
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    (old,) = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert (old.pid, old.smUtil, old.memUtil) == (411, 92, 28)
    assert old.timeStamp % 1_000_000 == 0 and old.timeStamp <= time.time() * 1e6
    (new,) = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
    assert (new.pid, new.smUtil, new.memUtil, new.timeStamp) == (411, 92, 28, old.timeStamp)
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than what was seen
        pynvml.nvmlDeviceGetProcessUtilization(h, old.timeStamp)
    with pytest.raises(pynvml.NVMLError_NotFound):  # no process busy on GPU 1
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(pynvml.nvmlDeviceGetHandleByIndex(1), 0)
    node.clear_processes(0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)


def test_a_late_ask_gets_the_average_since_last_seen(nvml):
    """NVML answers one structure per busy process over the samples since lastSeenTimeStamp:
    idle seconds count as zero, and the driver keeps only so many seconds of them."""
    node = nvml("h100x8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    node.set_process_utilization(0, 411, sm=0.6, memory=0.3)
    (first,) = pynvml.nvmlDeviceGetProcessUtilization(h, 0)  # lastSeen 0: the values now
    assert (first.smUtil, first.memUtil) == (60, 30)
    time.sleep(2.1)
    since = first.timeStamp - 4_000_000  # idle for the 4 s before it was set
    (late,) = pynvml.nvmlDeviceGetProcessUtilization(h, since)
    span = (late.timeStamp - since) / 1e6
    busy = (late.timeStamp - first.timeStamp) / 1e6  # set less than a second after `first`
    assert 60 * (busy - 1) / span - 1 <= late.smUtil <= 60 * busy / span + 1
    (info,) = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, since)
    assert info.smUtil == late.smUtil or info.timeStamp != late.timeStamp
    (capped,) = pynvml.nvmlDeviceGetProcessUtilization(h, 1)  # older than the driver's buffer
    assert capped.smUtil <= 60 * busy / 30 + 1 < late.smUtil
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, late.timeStamp)


def test_process_utilization_not_supported_with_mig_on(nvml):
    node = nvml("a100-mig")
    node.set_process_utilization(0, 7, sm=0.5, memory=0.1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(0), 0)


def test_profiling_calls_follow_gpu_loss_and_forced_failures(nvml):
    node = nvml("h100x8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    s = pynvml.nvmlGpmSampleAlloc()
    node.fail_call(0, "nvmlGpmSampleGet", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlGpmSampleGet(h, s)
    node.set_lost(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)


def test_control_rejects_bad_values(make_node, capsys, tmp_path):
    node = make_node("h100x8")
    with pytest.raises(ValueError, match="unknown GPM metric"):
        node.set_gpm(0, sm_busy=0.5)
    with pytest.raises(ValueError, match="ratio"):
        node.set_gpm(0, sm_activity=1.5)
    with pytest.raises(ValueError, match="no MIG instance"):
        node.set_gpm(0, mig=0, sm_activity=0.5)
    with pytest.raises(ValueError, match="ratio"):
        node.set_process_utilization(0, 1, sm=2.0, memory=0.0)
    node.set_gpm(1, nvlink_tx_bytes_per_second=5e9)
    assert node.get_gpm(1, "nvlink_tx_bytes_per_second") == 5e9
    state = str(node.path)
    assert sim_cli([state, "gpm", "0", "sm_activity=0.5", "dram_activity=0.25"]) == 0
    assert node.get_gpm(0, "dram_activity") == 0.25
    assert sim_cli([state, "process-util", "0", "42", "--sm", "0.5", "--memory", "0.2"]) == 0
    assert sim_cli([state, "gpm", "0", "bogus=1"]) == 2
    assert "unknown GPM metric 'bogus'" in capsys.readouterr().err
