"""The stand-in costs what NVML costs: per-call wall time, queueing and overlapping callers,
per-GPU and library-wide queues, per-field latencies, and the wall-time counters.

Only lower bounds on wall time are asserted where a cost must have been paid (a sleep cannot
end early); where callers must NOT wait for each other the costs are made large (500 ms) so
that the difference between overlapping and queueing is seconds, not scheduler noise.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from gpuquota.sim.nvml import cli
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.costs import H100_CALLS, parse
from gpuquota.sim.nvml.spec import load

MODELLED = {"mode": "modelled"}


def _timed(n: int, fn: Callable[[int], Any]) -> float:
    """Runs fn(0..n-1) in n threads at once; wall seconds until all are done."""
    threads = [threading.Thread(target=fn, args=(k,)) for k in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def test_h100_table_and_spec_validation() -> None:
    assert H100_CALLS["nvmlDeviceGetPcieThroughput"].overlap
    assert not H100_CALLS["nvmlDeviceGetTotalEnergyConsumption"].overlap
    assert parse({"queueing": "library"}).queueing == "library"
    for bad, message in (
        ({"mode": "fast"}, "mode"),
        ({"queueing": "node"}, "queueing"),
        ({"calls": {"GetPower": 1}}, "not an NVML function"),
        ({"calls": {"nvmlDeviceGetPowerUsage": -1}}, ">= 0"),
        ({"fields": {999: 1}}, "field id"),
        ({"speed": 1}, "unknown key"),
    ):
        with pytest.raises(ValueError, match=message):
            parse(bad)
    with pytest.raises(ValueError, match=r"gpus\[0\].nvml_costs"):
        load({"gpus": [{"model": "L4", "nvml_costs": {"x": 1}}]})


def test_modelled_calls_take_their_time(nvml: Callable[[Any], SimNode]) -> None:
    node = nvml({"model": "H100-SXM5-80GB", "count": 1, "nvml_costs": MODELLED})
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    started = time.perf_counter()
    pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    assert time.perf_counter() - started >= 0.0205
    started = time.perf_counter()
    pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert time.perf_counter() - started >= 0.0045
    # field values: each field's latency, reported in latencyUsec and paid in wall time
    started = time.perf_counter()
    values = pynvml.nvmlDeviceGetFieldValues(h, [197, 198, 83])
    assert time.perf_counter() - started >= 0.0048
    assert [v.latencyUsec for v in values] == [750, 750, 3400]
    # a per-call override on one GPU: a hung call
    node.set_call_cost(0, "nvmlDeviceGetPowerUsage", 200)
    started = time.perf_counter()
    pynvml.nvmlDeviceGetPowerUsage(h)
    assert time.perf_counter() - started >= 0.2
    node.set_costs(mode="instant")
    started = time.perf_counter()
    for _ in range(10):
        pynvml.nvmlDeviceGetPowerUsage(h)
    assert time.perf_counter() - started < 0.2  # ten 200 ms calls would take 2 s


def test_energy_queues_and_pcie_throughput_overlaps(nvml: Callable[[Any], SimNode]) -> None:
    node = nvml({"model": "H100-SXM5-80GB", "count": 1, "nvml_costs": MODELLED})
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    node.set_call_cost(None, "nvmlDeviceGetTotalEnergyConsumption", 500)
    node.set_call_cost(None, "nvmlDeviceGetPcieThroughput", 500, overlap=True)
    before = node.call_count("nvmlDeviceGetTotalEnergyConsumption")
    queued = _timed(4, lambda _k: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
    assert node.call_count("nvmlDeviceGetTotalEnergyConsumption") == before + 4
    assert queued >= 2.0  # four callers, one after another
    overlapped = _timed(4, lambda _k: pynvml.nvmlDeviceGetPcieThroughput(h, 0))
    assert overlapped < 1.6  # side by side: one 500 ms window (queued would be 2 s)


@pytest.mark.parametrize("queueing", ["gpu", "library"])
def test_queueing_across_gpus(nvml: Callable[[Any], SimNode], queueing: str) -> None:
    spec = {"model": "H100-SXM5-80GB", "count": 4, "nvml_costs": {**MODELLED,
            "queueing": queueing, "calls": {"nvmlDeviceGetTotalEnergyConsumption": 500}}}  # fmt: skip
    nvml(spec)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    took = _timed(4, lambda k: pynvml.nvmlDeviceGetTotalEnergyConsumption(handles[k]))
    if queueing == "gpu":
        assert took < 1.6  # one line per GPU: the four GPUs answer side by side (0.5 s)
    else:
        assert took >= 2.0  # one line for the library


def test_counters_run_with_wall_time(nvml: Callable[[Any], SimNode]) -> None:
    node = nvml({"model": "H100-SXM5-80GB", "count": 2})
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert node.counter_names()[:3] == ["pcie_tx_bytes", "pcie_rx_bytes", "sw_power_cap"]
    node.set_counter(0, "pcie_tx_bytes", 1e9)
    node.set(0, pcie_tx_bytes_per_second=1e9, pcie_rx_bytes_per_second=0.0,
             clock_event_reasons=pynvml.nvmlClocksEventReasonSwPowerCap)  # fmt: skip
    before = pynvml.nvmlDeviceGetFieldValues(h, [197, 198, 74, 78, 83])
    assert all(v.nvmlReturn == pynvml.NVML_SUCCESS for v in before)
    time.sleep(0.2)
    node.set(0, pcie_tx_bytes_per_second=0.0, clock_event_reasons=0)  # counters stop here
    after = pynvml.nvmlDeviceGetFieldValues(h, [197, 198, 74, 78, 83])
    later = pynvml.nvmlDeviceGetFieldValues(h, [197, 198, 74, 78])
    tx = after[0].value.ullVal - before[0].value.ullVal
    assert before[0].value.ullVal >= 1e9
    assert 0.2e9 <= tx < 5e9  # 1 GB/s for at least 0.2 s
    assert after[1].value.ullVal == before[1].value.ullVal == 0
    assert after[2].value.ullVal - before[2].value.ullVal >= 0.2e9  # ns throttled by power cap
    assert after[3].value.ullVal == before[3].value.ullVal  # idle bit was off meanwhile
    assert later[0].value.ullVal == after[0].value.ullVal  # stopped: monotonic, continuous
    assert later[2].value.ullVal == after[2].value.ullVal
    assert 0 < after[4].value.ullVal <= pynvml.nvmlDeviceGetTotalEnergyConsumption(h)  # mJ
    with pytest.raises(ValueError, match="unknown counter"):
        node.counter(0, "bogus")
    assert node.counter(1, "pcie_tx_bytes") == 0.0


def _energy_behind_power(handles: list[Any]) -> float:
    """Seconds GPU 0's energy call takes while GPU 1's power call is in flight."""
    power = threading.Thread(target=pynvml.nvmlDeviceGetPowerUsage, args=(handles[1],))
    power.start()
    time.sleep(0.05)
    started = time.perf_counter()
    pynvml.nvmlDeviceGetTotalEnergyConsumption(handles[0])
    took = time.perf_counter() - started
    power.join()
    return took


def test_cli_switches_costs_and_sets_one_call(nvml: Callable[[Any], SimNode]) -> None:
    node = nvml({"model": "H100-SXM5-80GB", "count": 2})  # instant (the suite's default)
    state = str(node.path)
    assert cli.main([state, "costs", "modelled", "--queueing", "library"]) == 0
    assert cli.main([state, "cost", "1", "nvmlDeviceGetPowerUsage", "250"]) == 0
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    started = time.perf_counter()
    pynvml.nvmlDeviceGetPowerUsage(handles[1])
    assert time.perf_counter() - started >= 0.25
    # library-wide queueing: GPU 0's energy call waits behind GPU 1's slow power call
    node.set_call_cost(1, "nvmlDeviceGetPowerUsage", 600)
    assert _energy_behind_power(handles) >= 0.4
    assert cli.main([state, "costs", "modelled", "--queueing", "gpu"]) == 0
    assert _energy_behind_power(handles) < 0.3  # its own line: 5 ms
    assert cli.main([state, "costs", "instant"]) == 0
    started = time.perf_counter()
    pynvml.nvmlDeviceGetPowerUsage(handles[1])
    assert time.perf_counter() - started < 0.3
    assert cli.main([state, "cost", "0", "GetPowerUsage", "1"]) == 2  # bad input: exit 2


def _gpm_get(s1: Any, s2: Any) -> None:
    get = pynvml.c_nvmlGpmMetricsGet_t()
    get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = 1
    get.sample1, get.sample2 = s1, s2
    get.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    pynvml.nvmlGpmMetricsGet(get)


def test_gpm_calls_cost_on_the_samples_gpu(nvml: Callable[[Any], SimNode]) -> None:
    # nvmlGpmMetricsGet takes no device handle, but it computes one GPU's metrics: it is
    # costed on that GPU (its per-GPU line), not on the library-wide line of system calls
    spec = {"model": "H100-SXM5-80GB", "count": 4, "nvml_costs": {**MODELLED,
            "calls": {"nvmlGpmMetricsGet": 500}}}  # fmt: skip
    node = nvml(spec)
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    pairs = []
    for h in handles:
        s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(h, s1)
        pynvml.nvmlGpmSampleGet(h, s2)
        pairs.append((s1, s2))
    before = node.call_count("nvmlGpmMetricsGet")
    took = _timed(4, lambda k: _gpm_get(*pairs[k]))
    assert node.call_count("nvmlGpmMetricsGet") == before + 4
    assert took < 1.6  # four GPUs side by side (the system line would take 2 s)
    same_gpu = _timed(2, lambda _k: _gpm_get(*pairs[0]))
    assert same_gpu >= 1.0  # one GPU's calls queue
    # a per-GPU cost applies to the samples' GPU only
    node.set_call_cost(None, "nvmlGpmMetricsGet", 0)
    node.set_call_cost(2, "nvmlGpmMetricsGet", 300)
    started = time.perf_counter()
    _gpm_get(*pairs[0])
    fast = time.perf_counter() - started
    started = time.perf_counter()
    _gpm_get(*pairs[2])
    assert time.perf_counter() - started >= 0.3
    assert fast < 0.3
    # the samples take the GPU's handle: costed on the GPU like any device call
    node.set_call_cost(1, "nvmlGpmSampleGet", 300)
    started = time.perf_counter()
    pynvml.nvmlGpmSampleGet(handles[1], pairs[1][0])
    assert time.perf_counter() - started >= 0.3
    for pair in pairs:
        for sample in pair:
            pynvml.nvmlGpmSampleFree(sample)


def test_charged_time_is_the_cost_tables_sum_per_gpu(nvml: Callable[[Any], SimNode]) -> None:
    # the modelled ns a call was charged: its table cost plus its fields' latencies, on its
    # GPU; the wall clock does not enter (benchmarks report a round's NVML work with it)
    node = nvml({"model": "H100-SXM5-80GB", "count": 2, "nvml_costs": MODELLED})
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    before = (node.charged_ms(), node.charged_ms(0), node.charged_ms(1))
    pynvml.nvmlDeviceGetTotalEnergyConsumption(h0)  # 5.0 ms
    pynvml.nvmlDeviceGetFieldValues(h1, [197, 198, 83])  # 0.02 + 0.75 + 0.75 + 3.4 ms
    total, gpu0, gpu1 = (node.charged_ms(), node.charged_ms(0), node.charged_ms(1))
    assert gpu0 - before[1] == pytest.approx(5.0, abs=1e-6)
    assert gpu1 - before[2] == pytest.approx(4.92, abs=1e-6)
    assert total - before[0] == pytest.approx(9.92, abs=1e-6)
    node.set_costs(mode="instant")  # instant calls cost nothing, so nothing is charged
    pynvml.nvmlDeviceGetTotalEnergyConsumption(h0)
    assert node.charged_ms(0) == gpu0
    with pytest.raises(ValueError):
        node.charged_ms(5)
