"""What NVML calls cost on a real GPU, for the stand-in to spend the same wall time.

The default is what an H100 SXM measured (../shared/nvml-h100.md, driver 580): per call, per
field value of nvmlDeviceGetFieldValues (each field has its own latency there), and whether
concurrent callers queue (nvmlDeviceGetTotalEnergyConsumption: 1, 2, 4 threads took 5.0,
10.5, 16.4 ms) or overlap (nvmlDeviceGetPcieThroughput samples a 20 ms window: 21.4 ms for 1,
2 or 4 threads). Whether calls on *different* GPUs queue was not measurable on one GPU; the
spec chooses: ``queueing: gpu`` (one line per GPU, the default) or ``library`` (one line for
the whole library).

A node spec may say::

    nvml_costs:
      mode: modelled            # or instant; default: modelled unless the environment
                                # variable GPUQUOTA_SIM_NVML_COSTS=instant (the test suite)
      queueing: gpu             # or library
      calls: {nvmlDeviceGetPowerUsage: 0.5, nvmlDeviceGetPcieThroughput: {ms: 21, overlap: true}}
      fields: {83: 3.4}         # per field id, in nvmlDeviceGetFieldValues
    gpus: [{model: H100-SXM5-80GB, count: 8, nvml_costs: {nvmlDeviceGetPowerUsage: 5000}}]

Per-GPU entries (and a model's ``nvml_costs``) override the node's for those GPUs only; a
cost of thousands of milliseconds is how tests simulate a hung call. Times are milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV = "GPUQUOTA_SIM_NVML_COSTS"  # "instant": no costs unless a spec asks for them
MODES = {"default": 0, "instant": 1, "modelled": 2}  # gq_cost_mode
QUEUEING = {"gpu": 0, "library": 1}  # gq_cost_scope
MAX_FIELD_ID = 320  # GQ_MAX_FIELD_ID in gqsim_costs.h


@dataclass(frozen=True, slots=True)
class CallCost:
    ms: float
    overlap: bool = False  # True: concurrent callers do not wait for each other


# Every call not listed: 0.003-0.04 ms on the H100.
H100_DEFAULT_MS = 0.02
H100_CALLS: dict[str, CallCost] = {
    "nvmlDeviceGetPcieThroughput": CallCost(21.4, overlap=True),
    "nvmlDeviceGetTotalEnergyConsumption": CallCost(5.0),
    "nvmlGpmMetricsGet": CallCost(4.5),
    "nvmlDeviceGetProcessUtilization": CallCost(2.2),
    "nvmlDeviceGetProcessesUtilizationInfo": CallCost(2.4),
    "nvmlGpmSampleGet": CallCost(0.74),
    "nvmlGpmMigSampleGet": CallCost(0.74),
    "nvmlDeviceGetPcieReplayCounter": CallCost(0.37),
    "nvmlDeviceGetComputeRunningProcesses": CallCost(0.17),
    "nvmlDeviceGetGraphicsRunningProcesses": CallCost(0.17),
    "nvmlDeviceGetMemoryInfo": CallCost(0.09),
    # an H100 SXM has no fan: the NOT_SUPPORTED answer itself took 0.36 ms (2026-11-25,
    # docs/real-h100.md)
    "nvmlDeviceGetFanSpeed": CallCost(0.36),
    "nvmlDeviceGetFieldValues": CallCost(0.02),  # plus each field's own latency below
}
# nvmlDeviceGetFieldValues per field (latencyUsec): [197, 198, 83] took 4.9 ms, energy alone
# 3.4 ms, the five clock-event-reason counters 1.3 ms, field 230 0.06 ms, most others
# 0.15-0.35 ms.
H100_FIELD_DEFAULT_MS = 0.25
H100_FIELDS: dict[int, float] = {
    83: 3.4,  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    191: 3.4,  # NVML_FI_DEV_ENERGY
    197: 0.75,  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    198: 0.75,  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    **dict.fromkeys((74, 75, 76, 77, 78, 79, 269, 270, 271), 0.26),  # clock event reasons
    230: 0.06,  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
}


@dataclass(frozen=True, slots=True)
class NodeCosts:
    """The cost model of one simulated node (the spec's ``nvml_costs``)."""

    mode: str = "default"
    queueing: str = "gpu"
    default_ms: float = H100_DEFAULT_MS
    calls: Mapping[str, CallCost] = field(default_factory=lambda: dict(H100_CALLS))
    field_default_ms: float = H100_FIELD_DEFAULT_MS
    fields: Mapping[int, float] = field(default_factory=lambda: dict(H100_FIELDS))


def parse_call_costs(raw: Any, where: str) -> dict[str, CallCost]:
    """``{function: ms | {ms, overlap}}`` -> CallCost per function; ValueError naming `where`."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must map NVML function names to milliseconds")
    out: dict[str, CallCost] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name.startswith("nvml") or len(name) >= 80:
            raise ValueError(f"{where}: {name!r} is not an NVML function name")
        overlap = False
        if isinstance(value, Mapping):
            unknown = set(value) - {"ms", "overlap"}
            if unknown:
                raise ValueError(f"{where}.{name}: unknown key(s) {', '.join(sorted(unknown))}")
            overlap = bool(value.get("overlap", False))
            value = value.get("ms")
        out[name] = CallCost(_ms(value, f"{where}.{name}"), overlap)
    return out


def parse(raw: Any) -> NodeCosts:
    """The spec's top-level ``nvml_costs`` (None: the H100 defaults)."""
    if raw is None:
        return NodeCosts()
    if not isinstance(raw, Mapping):
        raise ValueError("nvml_costs must be a mapping (mode, queueing, calls, fields)")
    unknown = set(raw) - {"mode", "queueing", "calls", "fields", "default_ms"}
    if unknown:
        raise ValueError(f"nvml_costs: unknown key(s) {', '.join(sorted(unknown))}")
    mode = str(raw.get("mode", "default"))
    if mode not in MODES:
        raise ValueError(f"nvml_costs.mode must be modelled or instant, not {mode!r}")
    queueing = str(raw.get("queueing", "gpu"))
    if queueing not in QUEUEING:
        raise ValueError(f"nvml_costs.queueing must be gpu or library, not {queueing!r}")
    calls = dict(H100_CALLS)
    calls.update(parse_call_costs(raw.get("calls", {}), "nvml_costs.calls"))
    fields = dict(H100_FIELDS)
    raw_fields = raw.get("fields", {})
    if not isinstance(raw_fields, Mapping):
        raise ValueError("nvml_costs.fields must map field ids to milliseconds")
    for fid, value in raw_fields.items():
        if not isinstance(fid, int) or isinstance(fid, bool) or not 0 <= fid < MAX_FIELD_ID:
            raise ValueError(f"nvml_costs.fields: {fid!r} is not a field id (0-{MAX_FIELD_ID - 1})")
        fields[fid] = _ms(value, f"nvml_costs.fields.{fid}")
    default_ms = _ms(raw.get("default_ms", H100_DEFAULT_MS), "nvml_costs.default_ms")
    return NodeCosts(mode, queueing, default_ms, calls, H100_FIELD_DEFAULT_MS, fields)


def _ms(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where} must be a number of milliseconds >= 0, not {value!r}")
    return float(value)
