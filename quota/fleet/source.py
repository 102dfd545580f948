"""The fleet history's source: the node agents' identity, health and error series, read from
Prometheus' HTTP API the way the usage ledger reads its counters (promhttp.matrix_query: raw
samples of a range selector, nothing extrapolated), and turned into readings (fleet/rules.py).

A reading is one scrape of one agent about one GPU: its ``gpu_info`` sample (serial, model,
PCI bus id, driver and VBIOS versions, with the agent's node) and the samples of the same
agent, GPU and time of ``gpu_health_state``, ``gpu_health_reason``,
``gpu_health_since_timestamp_seconds``, ``gpu_device_state`` and the memory counters. GPUs
without a serial (NVML answered none) are tracked by their UUID, prefixed ``uuid:``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuquota.quota.fleet.rules import Identity, Reading, XidSeries
from gpuquota.quota.promhttp import MatrixSeries, matrix_query

INFO = "gpu_info"
STATE = "gpu_health_state"
REASON = "gpu_health_reason"
SINCE = "gpu_health_since_timestamp_seconds"
DEVICE_STATE = "gpu_device_state"
XID = "gpu_xid_errors_total"
# memory counters and flags kept as history: metric -> the label that splits it
COUNTERS: dict[str, str | None] = {
    "gpu_ecc_aggregate_errors_total": "type",
    "gpu_remapped_rows_total": "cause",
    "gpu_row_remap_pending": None,
    "gpu_row_remap_failure": None,
    "gpu_retired_pages_total": "cause",
    "gpu_retired_pages_pending": None,
}
METRICS = (INFO, STATE, REASON, SINCE, DEVICE_STATE, XID, *COUNTERS)


def node_of(labels: dict[str, str]) -> str:
    """The agent's node: its ``node`` label, else the scrape target (as the ledger does)."""
    return labels.get("node") or labels.get("instance") or ""


@dataclass
class _Agent:
    """What one agent said about one GPU, by sample time."""

    info: dict[int, dict[str, str]] = field(default_factory=dict)
    state: dict[int, str] = field(default_factory=dict)
    reasons: dict[int, set[tuple[str, str]]] = field(default_factory=dict)
    since: dict[int, int] = field(default_factory=dict)
    lost: dict[int, bool] = field(default_factory=dict)
    counters: dict[int, dict[str, float]] = field(default_factory=dict)


def selector(span: int) -> str:
    return f'{{__name__=~"{"|".join(METRICS)}"}}[{span}s]'


def fetch(
    base_url: str, start: int, window: int, max_gap: int, timeout: float = 60.0
) -> tuple[list[Reading], list[XidSeries]]:
    """Readings and XID series of [start - max_gap, start + window + max_gap]. The range
    reaches back one second more than its length: a range excludes its start."""
    lo, hi = start - max_gap, start + window + max_gap
    return readings_of(matrix_query(base_url, selector(hi - lo + 1), hi, timeout))


def readings_of(result: list[MatrixSeries]) -> tuple[list[Reading], list[XidSeries]]:
    agents: dict[tuple[str, str], _Agent] = {}
    xids: list[XidSeries] = []
    for item in result:
        labels = item.metric
        name = labels.get("__name__", "")
        uuid = labels.get("uuid", "")
        if not uuid.startswith("GPU-"):
            continue  # MIG instances are parts of their GPU's board
        key = (uuid, node_of(labels))
        agent = agents.setdefault(key, _Agent())
        samples = [(round(t), v) for t, v in item.values if math.isfinite(v)]
        if name == XID:
            xids.append(XidSeries(uuid, key[1], labels.get("xid", "?"), tuple(samples)))
        elif name == INFO:
            for t, _ in samples:
                agent.info[t] = labels
        elif name == STATE:
            for t, v in samples:
                if v == 1:
                    agent.state[t] = labels.get("state", "")
        elif name == REASON:
            pair = (labels.get("reason", ""), labels.get("action", "none"))
            for t, v in samples:
                if v == 1:
                    agent.reasons.setdefault(t, set()).add(pair)
        elif name == SINCE:
            for t, v in samples:
                agent.since[t] = int(v)
        elif name == DEVICE_STATE:
            if labels.get("state") == "lost":
                for t, v in samples:
                    agent.lost[t] = v == 1
        elif name in COUNTERS:
            split = COUNTERS[name]
            counter = f"{name}:{labels.get(split, '')}" if split else name
            for t, v in samples:
                agent.counters.setdefault(t, {})[counter] = v
    readings = []
    for (uuid, node), agent in agents.items():
        for t, info in agent.info.items():
            serial = info.get("serial") or f"uuid:{uuid}"
            identity = Identity(
                uuid=uuid,
                node=node,
                pci_bus_id=info.get("pci_bus_id") or None,
                model=info.get("model") or None,
                driver_version=info.get("driver_version") or None,
                vbios_version=info.get("vbios_version") or None,
            )
            readings.append(
                Reading(
                    t=t,
                    serial=serial,
                    identity=identity,
                    state=agent.state.get(t, "unknown"),
                    reasons=tuple(sorted(agent.reasons.get(t, ()))),
                    since=agent.since.get(t),
                    lost=agent.lost.get(t, False),
                    counters=agent.counters.get(t, {}),
                )
            )
    xids.sort(key=lambda x: (x.uuid, x.node, x.code))
    return readings, xids
