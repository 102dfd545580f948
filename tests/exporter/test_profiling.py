"""GPM profiling metrics and per-process utilisation: the collector against the NVML
stand-in through the real pynvml, rendered natively and under dcgm-exporter's names."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuquota.exporter.collect.loop import CollectLoop
from gpuquota.exporter.collect.nvml import NvmlApi
from gpuquota.exporter.collect.profiling import (
    MIN_GPM_GAP,
    PROCESS_BASELINE_EVERY,
    PROCESS_SAMPLE_PERIOD,
    PROCESS_SPAN_MAX,
    ProfilingReader,
)
from gpuquota.exporter.collect.tiers import FIELD_TIERS, Tier
from gpuquota.exporter.expose.metrics import METRICS
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.snapshot import DeviceState
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.spec import load
from tests.exporter.scrape import parse, value

NvmlOn = Callable[[Any], tuple[SimNode, NvmlApi]]
MIB = 1024 * 1024
ONE_H100 = {"gpus": [{"model": "H100-SXM5-80GB", "count": 1}]}
H100_MIG = {"gpus": [{"model": "H100-SXM5-80GB", "count": 1, "mig": ["3g.40gb", "3g.40gb"]}]}
# The measured H100 under a bf16 matmul (../shared/nvml-h100.md), as the stand-in's rates.
UNDER_LOAD = {
    "graphics_activity": 0.9926,
    "sm_activity": 0.9588,
    "sm_occupancy": 0.1417,
    "tensor_activity": 0.9307,
    "hmma_tensor_activity": 0.9307,
    "dram_activity": 0.2378,
    "fp32_activity": 0.0,
    "pcie_tx_bytes_per_second": 6.18 * MIB,
    "pcie_rx_bytes_per_second": 15.84 * MIB,
    "nvlink_rx_bytes_per_second": 0.0,
}
DCGM_PROF = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PIPE_INT_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
}
NATIVE_PROF = {
    "gpu_graphics_engine_active_ratio",
    "gpu_sm_active_ratio",
    "gpu_sm_occupancy_ratio",
    "gpu_dram_active_ratio",
    "gpu_pipe_active_ratio",
    "gpu_nvlink_bandwidth_bytes_per_second",
}


def _two_rounds(collector: CollectLoop):
    collector.collect_once()
    time.sleep(MIN_GPM_GAP + 0.03)
    return collector.collect_once()


def test_gpm_values_native_and_dcgm(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.set_gpm(3, **UNDER_LOAD)
    snapshot = _two_rounds(CollectLoop(api, hostname="sim"))
    uuid = node.uuid(3)
    native = parse(Renderer().render(snapshot))
    at = {"gpu": "3", "uuid": uuid}
    assert value(native, "gpu_sm_active_ratio", **at) == pytest.approx(0.9588, abs=1e-6)
    assert value(native, "gpu_graphics_engine_active_ratio", **at) == pytest.approx(0.9926)
    assert value(native, "gpu_sm_occupancy_ratio", **at) == pytest.approx(0.1417)
    assert value(native, "gpu_dram_active_ratio", **at) == pytest.approx(0.2378)
    assert value(native, "gpu_pipe_active_ratio", pipe="tensor", **at) == pytest.approx(0.9307)
    assert value(native, "gpu_pipe_active_ratio", pipe="tensor_hmma", **at) == pytest.approx(0.9307)
    assert value(native, "gpu_pipe_active_ratio", pipe="fp32", **at) == 0.0
    pipes = {lbl["pipe"] for lbl, _v in native["gpu_pipe_active_ratio"] if lbl["uuid"] == uuid}
    assert pipes == {"tensor", "tensor_hmma", "tensor_imma", "tensor_dfma", "tensor_dmma",
                     "fp64", "fp32", "fp16", "integer"}  # fmt: skip
    for i in range(8):  # every H100 has the series, idle ones at a true 0
        assert value(native, "gpu_sm_active_ratio", gpu=str(i), uuid=node.uuid(i)) is not None

    dcgm = parse(Renderer(RenderOptions(compat=frozenset({"dcgm"}))).render(snapshot))
    assert set(dcgm) >= DCGM_PROF
    by = {"gpu": "3", "UUID": uuid}
    assert value(dcgm, "DCGM_FI_PROF_SM_ACTIVE", **by) == pytest.approx(0.9588)
    assert value(dcgm, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **by) == pytest.approx(0.9307)
    assert value(dcgm, "DCGM_FI_PROF_PCIE_TX_BYTES", **by) == pytest.approx(6.18 * MIB, rel=1e-6)
    assert value(dcgm, "DCGM_FI_PROF_PCIE_RX_BYTES", **by) == pytest.approx(15.84 * MIB, rel=1e-6)
    (labels, _v) = next(s for s in dcgm["DCGM_FI_PROF_DRAM_ACTIVE"] if s[0]["UUID"] == uuid)
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(labels)


def test_pcie_traffic_has_one_native_metric_the_byte_counters_rate(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.set(3, pcie_tx_bytes_per_second=2e9, pcie_rx_bytes_per_second=5e8)
    node.set_gpm(3, pcie_tx_bytes_per_second=6.18 * MIB)  # what GPM would say: not native
    snapshot = _two_rounds(CollectLoop(api, hostname="sim"))
    native = parse(Renderer().render(snapshot))
    pcie_traffic = {name for name in native if name.startswith("gpu_pcie_") and "bytes" in name}
    assert pcie_traffic == {
        "gpu_pcie_tx_bytes_per_second",
        "gpu_pcie_rx_bytes_per_second",
        "gpu_pcie_tx_bytes_total",
        "gpu_pcie_rx_bytes_total",
    }
    at = {"gpu": "3", "uuid": node.uuid(3)}
    assert value(native, "gpu_pcie_tx_bytes_per_second", **at) == pytest.approx(2e9, rel=0.2)
    assert value(native, "gpu_pcie_rx_bytes_per_second", **at) == pytest.approx(5e8, rel=0.2)
    assert not [s.name for s in METRICS if s.compat is None and "pcie" in s.name and "gpm" in
                s.accessor]  # fmt: skip


def test_gpus_before_hopper_omit_profiling_never_zero(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("mixed")
    for i in range(node.gpu_count):
        node.set_gpm(i, sm_activity=0.5)  # stored, but only Hopper answers GPM
    snapshot = _two_rounds(CollectLoop(api, hostname="sim"))
    native = parse(Renderer().render(snapshot))
    dcgm = parse(Renderer(RenderOptions(compat=frozenset({"dcgm"}))).render(snapshot))
    spec = load("mixed")
    for gpu in spec.gpus:
        hopper = gpu.model.compute_capability[0] >= 9
        uuids = {gpu.uuid, *(m.uuid for m in gpu.mig)}
        for name in NATIVE_PROF:
            has = any(lbl["uuid"] in uuids for lbl, _v in native.get(name, []))
            assert has == hopper, (gpu.model.key, name)
        for name in DCGM_PROF:
            has = any(lbl["UUID"] == gpu.uuid for lbl, _v in dcgm.get(name, []))
            assert has == hopper, (gpu.model.key, name)
    assert snapshot.nvml_errors_total == {}


def test_samples_closer_than_100ms_are_never_published(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.set_gpm(0, sm_activity=0.96)
    now = [1000.0]
    collector = CollectLoop(api, hostname="sim")
    collector.profiling = ProfilingReader(api, clock=lambda: now[0])
    collector.collect_once()
    now[0] += 0.05  # the GPU would answer zeros for this pair: it is not even asked
    quick = collector.collect_once()
    assert quick.devices[0].gpm is None
    time.sleep(MIN_GPM_GAP)  # the stand-in measures real time between its samples
    now[0] += MIN_GPM_GAP
    good = collector.collect_once()
    assert good.devices[0].gpm is not None
    assert good.devices[0].gpm.sm_active == pytest.approx(0.96)
    now[0] += 0.05  # too soon again: the last good averages, not zeros
    again = collector.collect_once()
    assert again.devices[0].gpm is good.devices[0].gpm


def test_gpm_per_mig_instance(nvml_on: NvmlOn) -> None:
    node, api = nvml_on(H100_MIG)
    node.set_gpm(0, mig=0, sm_activity=0.25, dram_activity=0.5)
    node.set_gpm(0, mig=1, sm_activity=0.75)
    node.set_gpm(0, sm_activity=0.5)
    snapshot = _two_rounds(CollectLoop(api, hostname="sim"))
    gpu, mig0, mig1 = snapshot.devices
    assert gpu.gpm is not None and gpu.gpm.sm_active == pytest.approx(0.5)
    assert mig0.gpm is not None and mig0.gpm.sm_active == pytest.approx(0.25)
    assert mig0.gpm.dram_active == pytest.approx(0.5)
    assert mig1.gpm is not None and mig1.gpm.sm_active == pytest.approx(0.75)
    native = parse(Renderer().render(snapshot))
    got = value(native, "gpu_sm_active_ratio", uuid=mig1.uuid, mig_profile="3g.40gb")
    assert got == pytest.approx(0.75)
    dcgm = parse(Renderer(RenderOptions(compat=frozenset({"dcgm"}))).render(snapshot))
    assert mig1.mig is not None
    gi = str(mig1.mig.gpu_instance_id)
    got = value(dcgm, "DCGM_FI_PROF_SM_ACTIVE", UUID=gpu.uuid, GPU_I_ID=gi, GPU_I_PROFILE="3g.40gb")
    assert got == pytest.approx(0.75)
    # NVML has no per-process utilisation with MIG on: left out, not zero
    assert gpu.process_utilization is None


def test_process_utilization_per_pid(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.add_process(0, 411, 8 * 2**30)
    node.add_process(0, 412, 2 * 2**30)
    node.set_process_utilization(0, 411, sm=0.92, memory=0.28)
    collector = CollectLoop(api, hostname="sim")
    first = collector.collect_once()
    assert [
        (p.pid, p.sm_ratio, p.memory_ratio) for p in first.devices[0].process_utilization or ()
    ] == [(411, 0.92, 0.28)]
    # the next round in the same second gets no new sample: the process keeps its value, held
    second = collector.collect_once()
    assert [(p.pid, p.sm_ratio, p.held) for p in second.devices[0].process_utilization or ()] == [
        (411, 0.92, True)
    ]
    native = parse(Renderer().render(second))
    at = {"gpu": "0", "uuid": node.uuid(0)}
    assert value(native, "gpu_process_sm_utilization_ratio", pid="411", **at) == 0.92
    assert value(native, "gpu_process_memory_utilization_ratio", pid="411", **at) == 0.28
    pids = {lbl["pid"] for lbl, _v in native["gpu_process_sm_utilization_ratio"]}
    assert pids == {"411"}  # 412 had no busy sample: idle, as the driver reports it
    assert second.devices[1].process_utilization == ()


def test_process_utilization_is_asked_at_most_once_a_second_per_gpu(nvml_on: NvmlOn) -> None:
    # modelled costs: the stand-in counts the calls (and charges each its 2.2 ms)
    node, api = nvml_on({**ONE_H100, "nvml_costs": {"mode": "modelled"}})
    node.add_process(0, 411, 8 * 2**30)
    node.set_process_utilization(0, 411, sm=0.92, memory=0.28)
    now = [1000.0]
    collector = CollectLoop(api, hostname="sim")
    collector.profiling = ProfilingReader(api, clock=lambda: now[0])
    calls = lambda: node.call_count("nvmlDeviceGetProcessUtilization")  # noqa: E731
    before = calls()
    first = collector.collect_once()
    asked = calls()  # pynvml calls the C function twice: the sample count, then the samples
    assert asked > before
    for _ in range(3):  # --interval=250ms: the driver has no newer sample yet
        now[0] += PROCESS_SAMPLE_PERIOD / 4
        between = collector.collect_once()
        # the last answer again, for the gauges, held: its seconds were counted once
        (kept,) = between.devices[0].process_utilization or ()
        (asked_sample,) = first.devices[0].process_utilization or ()
        assert (kept.pid, kept.sm_ratio, kept.held) == (
            asked_sample.pid,
            asked_sample.sm_ratio,
            True,
        )
        assert kept.sm_seconds == 0.0
    assert calls() == asked
    now[0] += PROCESS_SAMPLE_PERIOD / 4  # a second after the last question
    node.set_process_utilization(0, 411, sm=0.5, memory=0.1)
    time.sleep(1.05)  # the stand-in's driver takes its next sample
    later = collector.collect_once()
    assert calls() > asked
    (sample,) = later.devices[0].process_utilization or ()
    # the answer averages the time since the first answer's stamp: some of it before the change
    assert sample.pid == 411 and 0.5 <= sample.sm_ratio < 0.92
    assert sample.sampled_seconds >= 1.0
    assert sample.sm_seconds == pytest.approx(sample.sm_ratio * sample.sampled_seconds)


def test_a_process_with_no_new_sample_keeps_its_last_one_marked_held(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.add_process(0, 411, 8 * 2**30)
    node.set_process_utilization(0, 411, sm=0.92, memory=0.28)
    now = [1000.0]
    collector = CollectLoop(api, hostname="sim")
    collector.profiling = ProfilingReader(api, clock=lambda: now[0])
    (fresh,) = collector.collect_once().devices[0].process_utilization or ()
    assert (fresh.sm_ratio, fresh.held) == (0.92, False)
    node.set_process_utilization(0, 411, sm=0.0, memory=0.0)  # idle: the driver samples nothing
    time.sleep(1.05)
    now[0] += PROCESS_SAMPLE_PERIOD
    # the next answer averages the time since the last one: busy until the change
    (last,) = collector.collect_once().devices[0].process_utilization or ()
    assert 0 < last.sm_ratio <= 0.92 and not last.held and last.sampled_seconds >= 1.0
    time.sleep(1.05)
    now[0] += PROCESS_SAMPLE_PERIOD
    (held,) = collector.collect_once().devices[0].process_utilization or ()
    # the gauge keeps the last value a few seconds; the usage counters take only new samples
    assert (held.sm_ratio, held.held) == (last.sm_ratio, True)
    assert (held.sampled_seconds, held.sm_seconds) == (0.0, 0.0)


def test_no_gpm_pair_spans_a_lost_gpu(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.set_gpm(3, sm_activity=0.9)
    collector = CollectLoop(api, hostname="sim")
    before = _two_rounds(collector).devices[3]
    assert before.gpm is not None and before.gpm.sm_active == pytest.approx(0.9)
    node.set_lost(3)
    time.sleep(MIN_GPM_GAP + 0.03)
    assert collector.collect_once().devices[3].state is DeviceState.LOST
    time.sleep(0.3)  # gone for a while, busy at 90 % until it comes back idle
    node.set_gpm(3, sm_activity=0.0)
    node.set_lost(3, lost=False)
    back = collector.collect_once().devices[3]
    assert back.state is DeviceState.OK
    # its first sample since the loss starts a new pair: no average over the gap
    assert back.gpm is None
    time.sleep(MIN_GPM_GAP + 0.03)
    fresh = collector.collect_once().devices[3]
    assert fresh.gpm is not None and fresh.gpm.sm_active == 0.0


def test_a_failed_support_query_is_asked_again(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    node.set_gpm(0, sm_activity=0.5)
    node.fail_call(0, "nvmlGpmQueryDeviceSupport", 999)
    collector = CollectLoop(api, hostname="sim")
    failed = collector.collect_once()
    assert failed.devices[0].gpm is None
    assert failed.nvml_errors_total == {"nvmlGpmQueryDeviceSupport": 1}
    node.fail_call(0, "nvmlGpmQueryDeviceSupport", None)
    snapshot = _two_rounds(collector)
    assert snapshot.devices[0].gpm is not None
    assert snapshot.devices[0].gpm.sm_active == pytest.approx(0.5)


class _ThreadRecordingReader(ProfilingReader):
    """The real reader, noting which thread reads which GPU."""

    def __init__(self, api: NvmlApi) -> None:
        super().__init__(api)
        self.threads: dict[int, set[str]] = {}

    def read(self, index: int, *args: Any, **kwargs: Any) -> Any:
        self.threads.setdefault(index, set()).add(threading.current_thread().name)
        return super().read(index, *args, **kwargs)


def test_profiling_is_read_by_each_gpus_reader_at_its_rows_tier(nvml_on: NvmlOn) -> None:
    node, api = nvml_on("h100x8")
    for i in range(8):
        node.set_gpm(i, sm_activity=0.1 * (i + 1))
    node.set_process_utilization(3, 411, sm=0.5, memory=0.25)
    collector = CollectLoop(api, hostname="sim")
    reader = _ThreadRecordingReader(api)
    collector.profiling = reader
    snapshot = _two_rounds(collector)
    # one reader thread per GPU owns that GPU's profiling state
    assert reader.threads == {i: {f"nvml-gpu-{i}"} for i in range(8)}
    assert [d.gpm.sm_active if d.gpm else None for d in snapshot.devices] == pytest.approx(
        [0.1 * (i + 1) for i in range(8)]
    )
    # the metric table says how often, as the collector reads them: per-process utilisation
    # every collection (on the GPU's turn, at most once a second), GPM on the GPU's slow turn
    # (issue 20: a pair spanning the slow interval; a few GPUs' pairs per round, not all)
    tiers = FIELD_TIERS
    assert tiers["gpm"] is Tier.SLOW and tiers["process_utilization"] is Tier.FAST
    assert {s.tier for s in METRICS if s.accessor.startswith("DeviceSnapshot.gpm")} == {Tier.SLOW}
    # not due: the last values come back and NVML is not asked
    handle = api.handle(3)
    calls = api.call_stats()
    got = reader.read(3, handle, [], lambda fn, *a: fn(*a), gpm=False, processes=False)
    assert api.call_stats() == calls
    assert got.gpu["gpm"] is snapshot.devices[3].gpm
    assert got.gpu["process_utilization"] == snapshot.devices[3].process_utilization
    assert [p.pid for p in got.gpu["process_utilization"]] == [411]


def test_each_answer_adds_the_time_it_covers_whatever_its_shape(nvml_on: NvmlOn) -> None:
    """NVML documents one structure per busy process covering the time since lastSeen; a
    driver may also give a process one sample per second. The reader takes either: each
    sample covers the time since the one before it (the first since lastSeen), capped at
    PROCESS_SPAN_MAX; the very first answer is a baseline. (Answers of a shape the stand-in
    does not give are handed in through the reader's ``reads`` hook.)"""
    _node, api = nvml_on("h100x8")
    answers = [
        [(411, 100_000_000, 90, 0, 0, 0)],  # the first ask (lastSeen 0): a baseline
        [(411, 101_000_000, 50, 0, 0, 0), (411, 102_000_000, 70, 0, 0, 0),
         (412, 102_000_000, 20, 0, 0, 0)],  # two per-second samples, one average
        [(412, 200_000_000, 10, 0, 0, 0)],  # after a long stall: at most PROCESS_SPAN_MAX
    ]  # fmt: skip
    asked: list[int] = []

    def reads(call: Callable[..., Any], handle: Any, since: int) -> Any:
        asked.append(since)
        return answers.pop(0)

    now = [1000.0]
    reader = ProfilingReader(api, clock=lambda: now[0])
    (first,) = reader.read(0, None, (), reads, gpm=False).gpu["process_utilization"]
    assert (first.sm_ratio, first.sampled_seconds, first.sm_seconds) == (0.9, 0.0, 0.0)
    now[0] += PROCESS_SAMPLE_PERIOD
    a, b = reader.read(0, None, (), reads, gpm=False).gpu["process_utilization"]
    assert (a.pid, a.sm_ratio, a.sampled_seconds) == (411, 0.7, 2.0)
    assert a.sm_seconds == pytest.approx(0.5 + 0.7)
    assert (b.pid, b.sampled_seconds, b.sm_seconds) == (412, 2.0, pytest.approx(0.4))
    now[0] += PROCESS_SAMPLE_PERIOD
    _held, c = reader.read(0, None, (), reads, gpm=False).gpu["process_utilization"]
    assert (c.pid, c.sampled_seconds) == (412, PROCESS_SPAN_MAX)
    assert c.sm_seconds == pytest.approx(0.1 * PROCESS_SPAN_MAX)
    assert asked == [0, 100_000_000, 102_000_000]  # the newest stamp seen, each time


def test_an_answer_asked_from_0_is_marked_a_baseline_until_the_next_ask(nvml_on: NvmlOn) -> None:
    """After a loss (``forget``) the next ask is from 0: its samples cover unknown time, so
    they are marked ``baseline`` (the usage counters take them as unmeasured, not idle), and
    so are the rounds that repeat them; the next answer is no baseline, nor are the samples
    it keeps from before."""
    _node, api = nvml_on("h100x8")
    answers = [
        [(411, 100_000_000, 90, 0, 0, 0)],
        [(411, 101_000_000, 50, 0, 0, 0), (412, 101_000_000, 20, 0, 0, 0)],
        [(411, 200_000_000, 90, 0, 0, 0)],  # after the loss: asked from 0
        [(412, 201_000_000, 30, 0, 0, 0)],  # 411 has no new sample: held
    ]
    asked: list[int] = []

    def reads(call: Callable[..., Any], handle: Any, since: int) -> Any:
        asked.append(since)
        return answers.pop(0)

    now = [1000.0]
    reader = ProfilingReader(api, clock=lambda: now[0])

    def read() -> Any:
        got = reader.read(0, None, (), reads, gpm=False).gpu["process_utilization"]
        return [(u.pid, u.baseline, u.held) for u in got]

    assert read() == [(411, True, False)]  # the agent's first ask
    now[0] += PROCESS_SAMPLE_PERIOD
    assert read() == [(411, False, False), (412, False, False)]
    reader.forget(0)
    now[0] += PROCESS_SAMPLE_PERIOD
    assert read() == [(411, True, False)]
    now[0] += PROCESS_SAMPLE_PERIOD / 4  # too soon to ask: the answer repeated, held
    assert read() == [(411, True, True)]
    now[0] += PROCESS_SAMPLE_PERIOD
    assert read() == [(411, False, True), (412, False, False)]
    assert asked == [0, 100_000_000, 0, 200_000_000]


def test_a_gpu_idle_since_start_counts_its_first_busy_second(nvml_on: NvmlOn) -> None:
    """No busy sample yet, so no driver timestamp to ask from: after an answer with nothing
    busy, the next ask starts from that ask's wall-clock time less a period, and its answer
    counts (on the stand-in, exactly). A driver whose stamps are not on the wall clock makes
    that answer a baseline, and every PROCESS_BASELINE_EVERY idle asks one asks from 0."""
    _node, api = nvml_on("h100x8")
    answers: list[list[tuple[int, int, int, int, int, int]]] = []
    asked: list[int] = []

    def reads(call: Callable[..., Any], handle: Any, since: int) -> Any:
        asked.append(since)
        return answers.pop(0)

    now, wall = [1000.0], [1_800_000_000.25]
    reader = ProfilingReader(api, clock=lambda: now[0], wall=lambda: wall[0])

    def ask(*answer: tuple[int, int, int, int, int, int]) -> Any:
        answers.append(list(answer))
        got = reader.read(0, None, (), reads, gpm=False).gpu["process_utilization"]
        now[0] += PROCESS_SAMPLE_PERIOD
        wall[0] += PROCESS_SAMPLE_PERIOD
        return got

    assert ask() == ()  # nothing busy since the driver's samples began
    (first,) = ask((411, 1_800_000_001_000_000, 40, 0, 0, 0))
    assert asked == [0, 1_799_999_999_250_000]  # the idle ask's wall clock less a second
    assert first.sampled_seconds == pytest.approx(1.75)  # from there to the stamp
    assert first.sm_seconds == pytest.approx(0.4 * 1.75)

    # a driver on another clock: the answer is stamped before the time asked from
    skewed = ProfilingReader(api, clock=lambda: now[0], wall=lambda: wall[0] + 3600.0)
    reader = skewed
    assert ask() == ()
    (odd,) = ask((411, 1_800_000_010_000_000, 40, 0, 0, 0))
    assert (odd.sampled_seconds, odd.sm_seconds) == (0.0, 0.0)  # a baseline
    assert asked[-1] > 1_800_000_010_000_000

    # a long idle spell: one ask in PROCESS_BASELINE_EVERY is from 0
    reader = ProfilingReader(api, clock=lambda: now[0], wall=lambda: wall[0])
    del asked[:]
    for _ in range(PROCESS_BASELINE_EVERY + 2):
        assert ask() == ()
    assert asked[0] == 0 and asked[PROCESS_BASELINE_EVERY + 1] == 0
    assert all(since > 0 for since in asked[1 : PROCESS_BASELINE_EVERY + 1])


# nvmlDeviceGetProcessUtilization on an H200 (driver 580.159.04, docs/real-h100.md), asked
# about once a second with the newest stamp seen, two processes time-slicing the GPU: each
# process is sampled at its own phase of the second (.13 or .33), one structure per process.
H200_ANSWERS = [
    [(458, 1795847992134073, 15), (457, 1795847993134650, 72)],  # asked from 0
    [(457, 1795847994134474, 80), (458, 1795847993333692, 20)],
    [(457, 1795847995134065, 66), (458, 1795847995332783, 33)],
    [(458, 1795847996133594, 20), (457, 1795847996332686, 80)],
    [(458, 1795847997332604, 20), (457, 1795847997133772, 80)],
    [(458, 1795847998332851, 20), (457, 1795847998134079, 80)],
    [(458, 1795847999134333, 20), (457, 1795847999333040, 80)],
]


def test_each_process_covers_the_time_since_its_own_sample_before(nvml_on: NvmlOn) -> None:
    """On a real driver the processes' samples have their own phases: a sample covers the
    time since that process's sample before, not since the newest stamp of any process (which
    would cut up to a second off the process sampled earlier, each time)."""
    _node, api = nvml_on("h100x8")
    answers = [[(pid, stamp, sm, 0, 0, 0) for pid, stamp, sm in a] for a in H200_ANSWERS]
    asked: list[int] = []

    def reads(call: Callable[..., Any], handle: Any, since: int) -> Any:
        asked.append(since)
        return answers.pop(0)

    now = [1000.0]
    reader = ProfilingReader(api, clock=lambda: now[0], wall=lambda: 1_795_847_990.0 + now[0])
    covered: dict[int, float] = {457: 0.0, 458: 0.0}
    sm_seconds: dict[int, float] = {457: 0.0, 458: 0.0}
    for _ in H200_ANSWERS:
        for u in reader.read(0, None, (), reads, gpm=False).gpu["process_utilization"]:
            covered[u.pid] += u.sampled_seconds
            sm_seconds[u.pid] += u.sm_seconds
        now[0] += PROCESS_SAMPLE_PERIOD
    # each process: from its baseline sample to its newest one, nothing cut, nothing twice
    assert covered[457] == pytest.approx((1795847999333040 - 1795847993134650) / 1e6)
    assert covered[458] == pytest.approx((1795847999134333 - 1795847992134073) / 1e6)
    assert sm_seconds[457] == pytest.approx(0.8 * covered[457], rel=0.05)
    assert asked[1:] == [max(s for _p, s, _v in a) for a in H200_ANSWERS[:-1]]
