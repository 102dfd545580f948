"""Profiling reads: GPM metrics per GPU and per MIG instance, and per-process utilisation.

The collector calls ``ProfilingReader.read`` once per GPU per round (exporter/collect/loop.py);
every NVML call goes through ``NvmlApi`` and its errors propagate to the collector's usual
handling (counted, the device marked lost...).

GPM (Hopper and later) measures between two samples, so the reader keeps the previous
sample of every GPU and MIG instance and reports the averages since then. GPM is in the slow
tier (exporter/collect/tiers.py): a sample is taken on the GPU's slow turn, so each pair spans
one slow interval, the next pair starts where the last ended (no time is left out), and a
round computes the pairs of a few GPUs only; the last averages are reported in between. An
H100 answers samples taken less than 100 ms apart with NVML_SUCCESS and every metric 0.00:
such a pair is never computed. When the slow interval (or a run of ``collect_once`` calls) is
shorter than ``MIN_GPM_GAP`` the earlier sample is kept until the gap is long enough, and the
last good averages are reported meanwhile. A GPU without GPM reports ``gpm=None`` (its series are left out, never 0).

Per-process utilisation: the driver keeps one sample per second for each process that used
the GPU; the reader asks for the samples newer than the newest it has seen (NVML answers each
busy process's utilisation over that time), keeps the latest per process with the seconds it
covers (``sampled_seconds``, ``sm_seconds``: what the usage counters add, so an ask that comes
late loses nothing), and forgets a process with no sample for ``PROCESS_SAMPLE_TTL`` seconds
(the driver only samples busy processes: no sample means idle). A GPU with no busy sample yet
asks from the wall-clock time of its last idle answer (``PROCESS_BASELINE_EVERY``), so the
first busy second after a quiet start counts too. The driver has a new sample once a
second and the call costs about 2.2 ms per GPU, so it is asked at most once per
``PROCESS_SAMPLE_PERIOD`` per GPU, whatever the collection interval; the last values are
reported in between.

A GPU that is lost (or needs a reset) is forgotten (``forget``, called by the collector): when
it comes back its first GPM sample starts a new pair, so no average spans the time it was gone,
and nothing read before the loss is reported after it. Its first per-process answer is asked
from 0, a baseline whose samples cover unknown time: they are marked ``baseline`` (and so are
the rounds that repeat them until the next ask), and the usage counters take them as
unmeasured, not as idle (exporter/enrich/ledger.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuquota.exporter.collect import nvml
from gpuquota.exporter.collect.nvml import GpmSample, Handle, NvmlApi
from gpuquota.exporter.snapshot import GpmMetrics, ProcessUtilization

# Seconds between the two samples of a pair: 100 ms is the hardware's floor, plus margin for
# the time the calls themselves take.
MIN_GPM_GAP = 0.12
PROCESS_SAMPLE_TTL = 5.0  # seconds
PROCESS_SAMPLE_PERIOD = 1.0  # seconds: the driver's per-process sampling period
# The loop asks on a GPU's turn, a whole number of rounds >= the period apart: a round that
# starts a few milliseconds early must not miss its turn (and wait a whole cycle more).
PROCESS_ASK_SLACK = 0.05  # seconds
# The most time one answer is taken to cover: a GPU not asked for longer than this (a stalled
# reader) loses the rest, as the driver's sample buffer does.
PROCESS_SPAN_MAX = 30.0  # seconds
# A GPU with no busy process since the agent started has no sample timestamp to ask from. After
# an answer with nothing busy, the next ask starts from that ask's wall-clock time less a period
# (NVML stamps samples with the host's CPU time in microseconds), so a process's first busy
# second counts too. Every PROCESS_BASELINE_EVERY such asks one asks from 0 instead, and an
# answer stamped before the time asked from or more than PROCESS_CLOCK_SKEW_MAX after the wall
# clock is a baseline and turns this off: a driver on another clock loses a first second, not
# every sample.
PROCESS_BASELINE_EVERY = 120  # asks
PROCESS_CLOCK_SKEW_MAX = 60.0  # seconds

_PERCENT = 0.01
_MIB = 1024.0 * 1024.0
# GpmMetrics field -> (NVML_GPM_METRIC_* id, factor from NVML's unit to ours)
GPM_FIELDS: dict[str, tuple[int, float]] = {
    "graphics_active": (nvml.GPM_GRAPHICS_UTIL, _PERCENT),
    "sm_active": (nvml.GPM_SM_UTIL, _PERCENT),
    "sm_occupancy": (nvml.GPM_SM_OCCUPANCY, _PERCENT),
    "dram_active": (nvml.GPM_DRAM_BW_UTIL, _PERCENT),
    "tensor_active": (nvml.GPM_ANY_TENSOR_UTIL, _PERCENT),
    "tensor_hmma_active": (nvml.GPM_HMMA_TENSOR_UTIL, _PERCENT),
    "tensor_imma_active": (nvml.GPM_IMMA_TENSOR_UTIL, _PERCENT),
    "tensor_dfma_active": (nvml.GPM_DFMA_TENSOR_UTIL, _PERCENT),
    "tensor_dmma_active": (nvml.GPM_DMMA_TENSOR_UTIL, _PERCENT),
    "fp64_active": (nvml.GPM_FP64_UTIL, _PERCENT),
    "fp32_active": (nvml.GPM_FP32_UTIL, _PERCENT),
    "fp16_active": (nvml.GPM_FP16_UTIL, _PERCENT),
    "integer_active": (nvml.GPM_INTEGER_UTIL, _PERCENT),
    "pcie_tx_bytes_per_second": (nvml.GPM_PCIE_TX_PER_SEC, _MIB),
    "pcie_rx_bytes_per_second": (nvml.GPM_PCIE_RX_PER_SEC, _MIB),
    "nvlink_tx_bytes_per_second": (nvml.GPM_NVLINK_TOTAL_TX_PER_SEC, _MIB),
    "nvlink_rx_bytes_per_second": (nvml.GPM_NVLINK_TOTAL_RX_PER_SEC, _MIB),
}
_METRIC_IDS = tuple(metric for metric, _factor in GPM_FIELDS.values())

# How the collector runs a read: ``reads(fn, *args)`` returns fn's result, or None after
# recording an NVML error (exporter/collect/loop.py _Reads).
Reads = Callable[..., Any]


@dataclass(slots=True)
class _GpmUnit:
    """The sample pair of one GPU or MIG instance."""

    previous: GpmSample | None = None  # a buffer, holding a sample while previous_at is set
    previous_at: float | None = None  # None: no sample to pair with
    spare: GpmSample | None = None
    last: GpmMetrics | None = None


@dataclass(slots=True)
class _GpuState:
    gpm_supported: bool | None = None  # None: not asked yet
    units: dict[int | None, _GpmUnit] = field(default_factory=dict)  # GPU instance id or None
    seen_us: int = 0  # newest process-utilisation sample timestamp
    idle_asked_us: int = 0  # wall clock of the last ask that found nothing busy, seen_us 0
    wall_asks: int = 0  # asks in a row from the wall clock
    wall_clock_ok: bool = True  # False: the driver's stamps are not this host's wall clock
    processes_asked_at: float | None = None  # when the driver was last asked (clock)
    processes: dict[int, tuple[float, ProcessUtilization]] = field(default_factory=dict)
    # pid -> the stamp of its newest sample: a real driver samples each process at its own
    # phase of the second (docs/real-h100.md), so what a sample covers is per process
    stamps: dict[int, int] = field(default_factory=dict)
    last_processes: tuple[ProcessUtilization, ...] | None = None  # the latest answer


@dataclass(frozen=True, slots=True)
class ProfilingValues:
    """DeviceSnapshot fields for the GPU and, in order, for each of its MIG instances."""

    gpu: dict[str, Any]
    migs: list[dict[str, Any]]


class ProfilingReader:
    """Reads GPM and per-process utilisation for the collector, keeping the state they need
    between rounds."""

    def __init__(
        self,
        api: NvmlApi,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self._clock = clock
        self._wall = wall
        self._gpus: dict[int, _GpuState] = {}

    def read(
        self,
        index: int,
        handle: Handle,
        mig_instance_ids: Sequence[int],
        reads: Reads,
        *,
        gpm: bool = True,
        processes: bool = True,
    ) -> ProfilingValues:
        """This GPU's profiling values. `gpm`/`processes`: whether those reads are due this
        round (their metric rows' tier); when not, the last values are returned unread.

        Called from the GPU's own reader thread only: the state of one GPU is never shared
        between threads."""
        state = self._gpus.setdefault(index, _GpuState())
        if gpm and state.gpm_supported is None:  # asked again next round when the call failed
            state.gpm_supported = reads(self.api.gpm_supported, handle)
        gpu: dict[str, Any] = {}
        migs: list[dict[str, Any]] = [{} for _ in mig_instance_ids]
        if state.gpm_supported:
            gpu["gpm"] = self._gpm(state, handle, None, reads, gpm)
            for values, gi in zip(migs, mig_instance_ids, strict=True):
                values["gpm"] = self._gpm(state, handle, gi, reads, gpm)
        if not mig_instance_ids:
            gpu["process_utilization"] = (
                self._process_utilization(state, handle, reads) if processes else _kept(state)
            )
        return ProfilingValues(gpu=gpu, migs=migs)

    def forget(self, index: int) -> None:
        """GPU `index` was lost or needs a reset: nothing read before counts after it. Its
        sample buffers are kept for reuse; support is asked again (it may be another board)."""
        state = self._gpus.get(index)
        if state is None:
            return
        for unit in state.units.values():
            unit.previous_at = None
            unit.last = None
        state.gpm_supported = None
        state.processes.clear()
        state.stamps.clear()
        state.last_processes = None
        state.seen_us = 0  # the next answer is a baseline: nothing spans the loss
        state.idle_asked_us = state.wall_asks = 0
        state.processes_asked_at = None

    def _gpm(
        self,
        state: _GpuState,
        handle: Handle,
        gpu_instance_id: int | None,
        reads: Reads,
        due: bool,
    ) -> GpmMetrics | None:
        unit = state.units.setdefault(gpu_instance_id, _GpmUnit())
        if not due:
            return unit.last
        now = self._clock()
        previous_at = unit.previous_at if unit.previous is not None else None
        if previous_at is not None and now - previous_at < MIN_GPM_GAP:
            return unit.last  # too close: the hardware would answer zeros
        if unit.spare is None:
            unit.spare = reads(self.api.gpm_sample_alloc)
            if unit.spare is None:
                return None
        if not reads(self.api.gpm_sample, handle, unit.spare, gpu_instance_id):
            return unit.last
        taken_at = now
        if previous_at is not None:
            raw = reads(self.api.gpm_metrics, unit.previous, unit.spare, _METRIC_IDS)
            if raw is not None:
                unit.last = GpmMetrics(
                    **{
                        name: None if raw.get(metric) is None else raw[metric] * factor
                        for name, (metric, factor) in GPM_FIELDS.items()
                    }
                )
        unit.previous, unit.spare = unit.spare, unit.previous
        unit.previous_at = taken_at
        return unit.last

    @staticmethod
    def _since(state: _GpuState) -> tuple[int, bool]:
        """The timestamp to ask for samples after, and whether it comes from the wall clock."""
        if state.seen_us or not state.idle_asked_us or not state.wall_clock_ok:
            return state.seen_us, False
        if state.wall_asks >= PROCESS_BASELINE_EVERY:
            return 0, False
        return state.idle_asked_us - int(PROCESS_SAMPLE_PERIOD * 1e6), True

    def _process_utilization(
        self, state: _GpuState, handle: Handle, reads: Reads
    ) -> tuple[ProcessUtilization, ...] | None:
        now = self._clock()
        asked = state.processes_asked_at
        if asked is not None and now - asked < PROCESS_SAMPLE_PERIOD - PROCESS_ASK_SLACK:
            return _kept(state)  # the driver has no newer sample yet
        state.processes_asked_at = now
        since, from_wall = self._since(state)
        wall_us = int(self._wall() * 1e6)
        samples = reads(self.api.process_utilization, handle, since)
        if samples is None:
            state.last_processes = None
            return None
        state.wall_asks = state.wall_asks + 1 if from_wall else 0
        if not samples and state.seen_us == 0:
            state.idle_asked_us = wall_us
        if samples and from_wall:
            stamps = [s[1] for s in samples]
            if min(stamps) <= since or max(stamps) > wall_us + PROCESS_CLOCK_SKEW_MAX * 1e6:
                state.wall_clock_ok = False
                since = 0  # not the time these samples cover: a baseline
        latest: dict[int, tuple[int, int, int, int]] = {}
        covered_until: dict[int, int] = {}  # pid -> the end of what its samples covered
        spans: dict[int, tuple[float, float]] = {}  # pid -> (seconds covered, SM-seconds)
        for pid, stamp, sm, memory, encoder, decoder in sorted(samples, key=lambda s: s[1]):
            state.seen_us = max(state.seen_us, stamp)
            latest[pid] = (sm, memory, encoder, decoder)
            # A sample covers the time since the process's sample before (its own phase of
            # the second on a real driver), else since `since`; where a driver gives a process
            # several samples, each covers the time since the one before. An ask from 0 is a
            # baseline: what it averages over is not known.
            start = covered_until.get(pid) or state.stamps.get(pid) or since
            covered_until[pid] = max(start, stamp)
            span = 0.0 if since == 0 else min(max(stamp - start, 0) / 1e6, PROCESS_SPAN_MAX)
            seconds, sm_seconds = spans.get(pid, (0.0, 0.0))
            spans[pid] = (seconds + span, sm_seconds + sm / 100.0 * span)
        state.stamps.update(covered_until)
        for pid, (sm, memory, encoder, decoder) in latest.items():
            seconds, sm_seconds = spans[pid]
            state.processes[pid] = (
                now,
                ProcessUtilization(
                    pid=pid,
                    sm_ratio=sm / 100.0,
                    memory_ratio=memory / 100.0,
                    encoder_ratio=encoder / 100.0,
                    decoder_ratio=decoder / 100.0,
                    sampled_seconds=seconds,
                    sm_seconds=sm_seconds,
                    baseline=since == 0,
                ),
            )
        for pid in [p for p, (at, _u) in state.processes.items() if now - at > PROCESS_SAMPLE_TTL]:
            del state.processes[pid]
            state.stamps.pop(pid, None)
        # older samples kept for the gauges are no baseline once an answer covers time
        state.last_processes = tuple(
            u if at == now else replace(_held(u), baseline=since == 0)
            for at, u in sorted(state.processes.values(), key=lambda e: e[1].pid)
        )
        return state.last_processes


def _kept(state: _GpuState) -> tuple[ProcessUtilization, ...] | None:
    """What a round that does not ask reports: the latest answer, every sample held (its
    seconds were added once, in the round that asked)."""
    return None if state.last_processes is None else tuple(map(_held, state.last_processes))


def _held(u: ProcessUtilization) -> ProcessUtilization:
    """``u`` as a sample kept for the gauges: it adds nothing more to the usage counters."""
    return u if u.held else replace(u, held=True, sampled_seconds=0.0, sm_seconds=0.0)
